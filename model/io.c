/* Errors and file reading for the whole model library (model/io.h). */
#include "model/io.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

fg_status fgm_vfailf(char *err, size_t n, fg_status st, const char *fmt, va_list ap) {
    if (err && n)
        vsnprintf(err, n, fmt, ap);
    return st;
}

fg_status fgm_failf(char *err, size_t n, fg_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fgm_vfailf(err, n, st, fmt, ap);
    va_end(ap);
    return st;
}

/* The whole stream f (a pipe, a FIFO, standard input) into a buffer, at
 * most FGM_MAX_FILE_BYTES. */
static fg_status read_stream(FILE *f, const char *path, unsigned char **out, size_t *len, char *err, size_t err_size) {
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = malloc(cap);
    if (!buf)
        return fgm_failf(err, err_size, FG_ERR_OUT_OF_MEMORY, "out of memory reading %s", path);
    for (;;) {
        if (n == cap) {
            if ((uint64_t)cap >= (uint64_t)FGM_MAX_FILE_BYTES || cap > SIZE_MAX / 2) {
                if (fgetc(f) == EOF) /* exactly the limit */
                    break;
                free(buf);
                return fgm_failf(err, err_size, FG_ERR_IO, "%s holds more than the %lld bytes this tool reads", path,
                                (long long)FGM_MAX_FILE_BYTES);
            }
            const size_t grown =
                (uint64_t)(2 * cap) < (uint64_t)FGM_MAX_FILE_BYTES ? 2 * cap : (size_t)FGM_MAX_FILE_BYTES;
            unsigned char *nb = realloc(buf, grown);
            if (!nb) {
                free(buf);
                return fgm_failf(err, err_size, FG_ERR_OUT_OF_MEMORY, "out of memory reading %s", path);
            }
            buf = nb;
            cap = grown;
        }
        const size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        free(buf);
        return fgm_failf(err, err_size, FG_ERR_IO, "cannot read %s", path);
    }
    *out = buf;
    *len = n;
    return FG_OK;
}

fg_status fgm_read_file(const char *path, void **data, size_t *size, char *err, size_t err_size) {
    *data = NULL;
    *size = 0;
    const int std_in = !strcmp(path, "-"); /* standard input */
    FILE *f = std_in ? stdin : fopen(path, "rb");
    if (!f)
        return fgm_failf(err, err_size, FG_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    /* A regular file's size comes from the open file itself; a pipe, FIFO,
     * socket or terminal on standard input is read to its end; a directory
     * opens, but its "size" from ftell is LONG_MAX, and a device may never
     * end: both are refused. */
    struct stat sb;
    fg_status st = FG_OK;
    unsigned char *buf = NULL;
    size_t len = 0;
    if (fstat(fileno(f), &sb) != 0) {
        st = fgm_failf(err, err_size, FG_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
    } else if (S_ISFIFO(sb.st_mode) || S_ISSOCK(sb.st_mode) || (std_in && isatty(fileno(f)))) {
        st = read_stream(f, path, &buf, &len, err, err_size);
    } else if (!S_ISREG(sb.st_mode)) {
        st = fgm_failf(err, err_size, FG_ERR_IO, "%s is not a file or a pipe (a %s)", path,
                      S_ISDIR(sb.st_mode) ? "directory" : "device");
    } else if ((uint64_t)sb.st_size > (uint64_t)FGM_MAX_FILE_BYTES) {
        st = fgm_failf(err, err_size, FG_ERR_IO, "%s is %lld bytes, more than the %lld this tool reads", path,
                      (long long)sb.st_size, (long long)FGM_MAX_FILE_BYTES);
    } else {
        len = (size_t)sb.st_size;
        buf = malloc(len > 0 ? len : 1);
        if (!buf)
            st = fgm_failf(err, err_size, FG_ERR_OUT_OF_MEMORY, "out of memory reading %s (%zu bytes)", path, len);
        if (st == FG_OK && fread(buf, 1, len, f) != len)
            st = fgm_failf(err, err_size, FG_ERR_IO, "cannot read %s (%zu bytes expected)", path, len);
        if (st == FG_OK && fgetc(f) != EOF) /* the file grew while it was read */
            st = fgm_failf(err, err_size, FG_ERR_IO, "%s changed while it was read", path);
    }
    if (!std_in)
        fclose(f);
    if (st) {
        free(buf);
        return st;
    }
    *data = buf;
    *size = len;
    return FG_OK;
}
