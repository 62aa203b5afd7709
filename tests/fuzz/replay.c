/* Replays a fuzz corpus through a target (regression test, no libFuzzer):
 * replay DIR... runs LLVMFuzzerTestOneInput on every file in every DIR. */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/llama2c.h"
#include "model/io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A hang fails the replay, as libFuzzer's -timeout fails a run: each input has 60 s. */
static const char *g_input = "";

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "replay: an input ran past 60 s (a hang): ";
    if (write(2, msg, sizeof msg - 1) < 0 || write(2, g_input, strlen(g_input)) < 0 || write(2, "\n", 1) < 0)
        _exit(3);
    _exit(2);
}

int main(int argc, char **argv) {
    signal(SIGALRM, on_alarm);
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
            static char current[4096];
            snprintf(current, sizeof current, "%s", path);
            g_input = current;
            alarm(60);
            LLVMFuzzerTestOneInput(buf, size);
            alarm(0);
            free(buf);
            files++;
        }
        closedir(d);
    }
    printf("replayed %d corpus files\n", files);
    printf("%d passed, %d failed\n", files, failed);
    return failed || files == 0;
}
