/* libFuzzer target: the llama2.c checkpoint loader on arbitrary bytes. */
#include <stddef.h>
#include <stdint.h>

#include "model/llama2c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fgm_llama_model m;
    char err[256];
    if (fgm_llama_load_memory(data, size, &m, err, sizeof err) == FG_OK) {
        /* touch the ends of the tensors the header promised */
        const fgm_llama_config *c = &m.config;
        volatile float sink = ((const float *)m.weights.wcls.data)[(size_t)c->vocab_size * c->dim - 1] + m.weights.rms_final[c->dim - 1];
        (void)sink;
        fgm_llama_free(&m);
    }
    return 0;
}
