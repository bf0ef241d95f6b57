/* The protobuf text format, driven by protobuf-c descriptors (protobuf-c has no text format):
 * the legacy v1 API sends its request header, response header, status and server status as
 * text protobuf. Generic over messages, so that no message needs code of its own. Pure
 * functions over buffers, no I/O; the config.pbtxt parser is Python (config.py), so there is
 * no C tokenizer to share. */
#ifndef OI_CODEC_PBTEXT_H
#define OI_CODEC_PBTEXT_H

#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

#include "core/buf.h"

/* Appends `m` as text, fields in field-number order with proto3 defaults left out, as
 * protobuf's C++ TextFormat prints them: DebugString's layout (one field a line, nested
 * messages indented by two spaces) or, with `one_line`, ShortDebugString's (single spaces, no
 * trailing one). Strings are C-escaped, bytes >= 0x80 as octal too, so that the text is
 * plain ASCII and fits an HTTP header. Map fields print their entries in stored order.
 * Returns 0, or -1 when out of memory. */
int oi_pbtext_write(oi_sbuf_t *out, const ProtobufCMessage *m, int one_line);

/* Appends `m` in protobuf's JSON mapping: lowerCamelCase names, 64-bit integers as strings,
 * enums by name, bytes in base64, maps as objects, proto3 defaults left out. 0 or -1. */
int oi_pbjson_write(oi_sbuf_t *out, const ProtobufCMessage *m);

/* Parses text-format `text` (`len` bytes) as a message of type `d`: fields by name, `:` before
 * scalars, `{}` or `<>` around messages (with an optional `:`), `[a, b]` lists for repeated
 * fields, enum values by name or number, `#` comments, ',' or ';' between fields. An unknown
 * field, a repeated non-repeated field, a value out of range or malformed text is refused
 * with a message in `err` that names the field and the column. Returns a new message (free
 * with protobuf_c_message_free_unpacked(m, NULL)) or NULL. */
ProtobufCMessage *oi_pbtext_parse(const ProtobufCMessageDescriptor *d, const char *text, size_t len, char *err,
                                  size_t errcap);

#endif
