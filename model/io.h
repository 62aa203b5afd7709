/* The model library's one error style and its one file reader. Every
 * fallible function takes (char *err, size_t err_size), writes a one-line
 * reason there and returns a fg_status. */
#ifndef FGM_IO_H
#define FGM_IO_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "fastgen.h"

/* Writes a one-line reason into err (err_size bytes) and returns st. */
fg_status fgm_failf(char *err, size_t err_size, fg_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
fg_status fgm_vfailf(char *err, size_t err_size, fg_status st, const char *fmt, va_list ap)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 0)))
#endif
    ;

/* Whole file into memory (the caller frees *data): the one reader for every
 * file the tools read. A regular file, or a pipe, FIFO or socket read to its
 * end; "-" is standard input (a terminal too). Refuses directories, devices
 * and more than FGM_MAX_FILE_BYTES. */
#define FGM_MAX_FILE_BYTES ((int64_t)1 << 36)
fg_status fgm_read_file(const char *path, void **data, size_t *size, char *err, size_t err_size);

#endif
