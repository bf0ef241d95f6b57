/* The main() of a fuzz target built without libFuzzer (-DOI_FUZZ_MAIN, with gcc or clang):
 * runs LLVMFuzzerInitialize, then LLVMFuzzerTestOneInput on each file named on the command
 * line, and on each file of each directory named there (a corpus), in name order. Included
 * at the end of a target's source. */
#ifndef OI_FUZZ_REPLAY_MAIN_H
#define OI_FUZZ_REPLAY_MAIN_H

#ifdef OI_FUZZ_MAIN

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        return -1;
    }
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0, n;
    uint8_t chunk[65536];
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
        if (len + n > cap) {
            cap = (len + n) * 2;
            uint8_t *p = realloc(buf, cap);
            if (p == NULL) {
                free(buf);
                fclose(f);
                return -1;
            }
            buf = p;
        }
        memcpy(buf + len, chunk, n);
        len += n;
    }
    fclose(f);
    /* An exact-size copy, so that reads past the input are caught as they are by libFuzzer. */
    uint8_t *exact = malloc(len ? len : 1);
    if (exact == NULL) {
        free(buf);
        return -1;
    }
    if (len)
        memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 0;
}

static int replay_by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

static int replay_path(const char *path, int *count)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        perror(path);
        return -1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        (*count)++;
        return replay_file(path);
    }
    struct dirent **names;
    int n = scandir(path, &names, NULL, replay_by_name);
    if (n < 0) {
        perror(path);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < n; i++) {
        if (names[i]->d_name[0] != '.' && rc == 0) {
            char child[4096];
            snprintf(child, sizeof(child), "%s/%s", path, names[i]->d_name);
            rc = replay_path(child, count);
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    LLVMFuzzerInitialize(&argc, &argv);
    int count = 0;
    for (int i = 1; i < argc; i++)
        if (replay_path(argv[i], &count) != 0)
            return 2;
    printf("replayed %d inputs\n", count);
    return 0;
}

#endif
#endif
