/* Replays a fuzz corpus through a target (regression test, no libFuzzer):
 * replay DIR... runs LLVMFuzzerTestOneInput on every file in every DIR. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/llama2c.h"
#include "model/io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv) {
    int files = 0, failed = 0;
    for (int a = 1; a < argc; a++) {
        DIR *d = opendir(argv[a]);
        if (!d) {
            fprintf(stderr, "replay: cannot open %s\n", argv[a]);
            failed++;
            continue;
        }
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.')
                continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[a], e->d_name);
            void *buf;
            size_t size;
            char err[256];
            if (fgm_read_file(path, &buf, &size, err, sizeof err) != FG_OK) {
                fprintf(stderr, "replay: %s\n", err);
                failed++;
                continue;
            }
            LLVMFuzzerTestOneInput(buf, size);
            free(buf);
            files++;
        }
        closedir(d);
    }
    printf("replayed %d corpus files\n", files);
    printf("%d passed, %d failed\n", files, failed);
    return failed || files == 0;
}
