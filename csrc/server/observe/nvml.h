/* GPU readings for the metrics endpoint through NVML, loaded with dlopen so that the server
 * neither links against the NVIDIA driver nor needs it: without libnvidia-ml or a GPU there
 * is simply no GPU to report. */
#ifndef OI_SERVER_OBSERVE_NVML_H
#define OI_SERVER_OBSERVE_NVML_H

#include <stddef.h>
#include <stdint.h>

typedef struct oi_nvml_s oi_nvml_t;

/* One GPU at one moment; a field NVML could not read is -1. */
typedef struct oi_gpu_sample_s {
    char uuid[96];
    double utilization;   /* [0, 1] */
    double memory_total;  /* bytes */
    double memory_used;   /* bytes */
    double power_usage;   /* watts */
    double power_limit;   /* watts */
    double energy_joules; /* since oi_nvml_open */
} oi_gpu_sample_t;

/* Loads NVML and lists the GPUs this process may use (CUDA_VISIBLE_DEVICES as indices or
 * GPU-UUIDs); NULL when there is no library, it fails to start, or there is no GPU. */
oi_nvml_t *oi_nvml_open(void);

/* The number of GPUs listed. */
int oi_nvml_count(const oi_nvml_t *nv);

/* Reads GPU `i` (0 <= i < count). One thread at a time. */
void oi_nvml_read(oi_nvml_t *nv, int i, oi_gpu_sample_t *out);

/* Shuts NVML down and unloads it; NULL is ignored. */
void oi_nvml_close(oi_nvml_t *nv);

#endif
