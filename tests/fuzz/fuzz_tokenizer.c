/* libFuzzer target: the tokenizer loader, encoder and decoder. Input: a
 * uint16 vocabulary size, a uint16 length L, L bytes of text to encode, then
 * the tokenizer file. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4)
        return 0;
    int32_t vocab = (int32_t)(data[0] | data[1] << 8) % 600;
    size_t text_len = (size_t)(data[2] | data[3] << 8);
    data += 4;
    size -= 4;
    if (text_len > size)
        text_len = size;
    char *text = malloc(text_len + 1);
    if (!text)
        return 0;
    memcpy(text, data, text_len);
    text[text_len] = '\0';
    fgm_tokenizer t;
    char err[256];
    if (fgm_tokenizer_load_memory(data + text_len, size - text_len, vocab, &t, err, sizeof err) == FG_OK) {
        int32_t tokens[1024], n = 0;
        if (fgm_tokenizer_encode(&t, text, 1, tokens, 1024, &n) == FG_OK) {
            size_t total = 0;
            for (int32_t i = 1; i < n; i++)
                total += strlen(fgm_tokenizer_decode(&t, tokens[i - 1], tokens[i]));
            (void)total;
        }
        fgm_tokenizer_decode(&t, 1, vocab + 5); /* out of range: empty */
        fgm_tokenizer_free(&t);
    }
    free(text);
    return 0;
}
