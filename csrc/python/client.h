/* The client side of the _core module. */
#ifndef OI_PYTHON_CLIENT_H
#define OI_PYTHON_CLIENT_H

#include "python/numpy_api.h"

/* _core.HttpConnection. */
extern PyTypeObject oi_py_conn_type;

#endif
