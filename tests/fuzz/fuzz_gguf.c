/* libFuzzer target: the GGUF reader on arbitrary bytes, then, for what it
 * accepts, the first and last row of every tensor dequantized, the llama
 * model and the SentencePiece vocabulary from the metadata, and an encode. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "model/dequant.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fgm_gguf g;
    char err[512];
    if (fgm_gguf_parse(data, size, &g, err, sizeof err) != FG_OK)
        return 0;
    for (int64_t i = 0; i < g.n_tensors; i++) {
        const fgm_gguf_tensor *t = &g.tensors[i];
        const fgm_type_info *ti = fgm_type_info_of(t->type);
        if (!ti->to_float || t->ne[0] > 4096)
            continue;
        const int64_t rows = t->bytes / (uint64_t)fgm_type_row_bytes(t->type, t->ne[0]);
        float *row = malloc((size_t)t->ne[0] * sizeof *row);
        if (!row)
            continue;
        ti->to_float(t->data, row, t->ne[0]);
        ti->to_float((const unsigned char *)t->data + (size_t)(rows - 1) * (size_t)fgm_type_row_bytes(t->type, t->ne[0]),
                     row, t->ne[0]);
        free(row);
    }
    fgm_llama_model m;
    if (fgm_llama_from_gguf(&g, &m, err, sizeof err) == FG_OK) {
        fgm_tokenizer tok;
        if (fgm_tokenizer_from_gguf(&g, m.config.vocab_size, &tok, err, sizeof err) == FG_OK) {
            int32_t ids[64], n;
            fgm_tokenizer_encode(&tok, "ab a\xc3\xa9 b", 1, ids, 64, &n);
            fgm_tokenizer_free(&tok);
        }
        fgm_llama_free(&m);
    }
    fgm_gguf_free(&g);
    return 0;
}
