/* fastgen info: what a model file holds and whether fastgen can run it. */
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"
#include "model/dequant.h"
#include "model/gguf.h"

static const char *k_info_help = "usage: fastgen info FILE\n"
                                 "\n"
                                 "Describes a GGUF file or a llama2.c checkpoint: architecture, shape, context,\n"
                                 "tensor types and counts, tokenizer, and whether fastgen can run it (and why\n"
                                 "not). Exit status 0 when it can, 1 when it cannot or the file is unreadable.\n";

static int info_gguf(const char *path) {
    fgm_gguf g;
    char err[512];
    if (fgm_gguf_open(path, &g, err, sizeof err) != FG_OK) {
        fprintf(stderr, "fastgen info: %s\n", err);
        return 1;
    }
    char arch[64], name[128], tok[64], pre[64];
    fgm_gguf_get_str(&g, "general.architecture", arch, sizeof arch);
    fgm_gguf_get_str(&g, "general.name", name, sizeof name);
    fgm_gguf_get_str(&g, "tokenizer.ggml.model", tok, sizeof tok);
    fgm_gguf_get_str(&g, "tokenizer.ggml.pre", pre, sizeof pre);
    printf("file:          %s (GGUF v%u, %zu bytes)\n", path, g.version, g.size);
    printf("name:          %s\n", name[0] ? name : "(none)");
    printf("architecture:  %s\n", arch[0] ? arch : "(none)");
    int64_t counts[FGM_GGML_N_TYPES] = {0}, unknown = 0;
    for (int64_t i = 0; i < g.n_tensors; i++) {
        if (g.tensors[i].type >= 0 && g.tensors[i].type < FGM_GGML_N_TYPES)
            counts[g.tensors[i].type]++;
        else
            unknown++;
    }
    printf("tensors:       %lld:", (long long)g.n_tensors);
    for (int t = 0; t < FGM_GGML_N_TYPES; t++)
        if (counts[t])
            printf(" %lld %s", (long long)counts[t], fgm_type_info_of(t)->name);
    printf("\n");
    const fgm_gguf_kv *tokens = fgm_gguf_find(&g, "tokenizer.ggml.tokens");
    printf("tokenizer:     %s%s%s%s, %llu tokens\n", tok[0] ? tok : "(none)", pre[0] ? " (pre-tokenizer " : "", pre,
           pre[0] ? ")" : "", tokens ? (unsigned long long)tokens->n_elems : 0ull);
    fgm_llama_model m;
    fg_status st = fgm_llama_from_gguf(&g, &m, err, sizeof err);
    if (st == FG_OK) {
        const fgm_llama_config *c = &m.config;
        printf("shape:         %d layers, width %d, MLP %d, %d query / %d KV heads of %d, vocabulary %d\n",
               (int)c->n_layers, (int)c->dim, (int)c->hidden_dim, (int)c->n_heads, (int)c->n_kv_heads,
               (int)c->head_size, (int)c->vocab_size);
        printf("context:       %d tokens; RoPE base %g; RMSNorm eps %g; %s classifier\n", (int)c->seq_len,
               (double)c->rope_theta, (double)c->rms_eps, c->shared_classifier ? "shared" : "separate");
        printf("weights:       %zu bytes as stored (kept in their types, mapped from the file)\n",
               fgm_llama_weight_bytes(&m));
        fgm_tokenizer t;
        st = fgm_tokenizer_from_gguf(&g, c->vocab_size, &t, err, sizeof err);
        if (st == FG_OK)
            fgm_tokenizer_free(&t);
        fgm_llama_free(&m);
    }
    fgm_gguf_free(&g);
    if (st == FG_OK)
        printf("fastgen:       can run it\n");
    else
        printf("fastgen:       cannot run it: %s\n", err);
    return st == FG_OK ? 0 : 1;
}

static int info_llama2c(const char *path) {
    fgm_llama_model m;
    char err[512];
    fg_status st = fgm_llama_load_file(path, &m, err, sizeof err);
    if (st) {
        fprintf(stderr, "fastgen info: %s\n", err);
        return 1;
    }
    const fgm_llama_config *c = &m.config;
    printf("file:          %s (llama2.c checkpoint)\n", path);
    printf("architecture:  llama (llama2.c)\n");
    printf("shape:         %d layers, width %d, MLP %d, %d query / %d KV heads of %d, vocabulary %d\n",
           (int)c->n_layers, (int)c->dim, (int)c->hidden_dim, (int)c->n_heads, (int)c->n_kv_heads, (int)c->head_size,
           (int)c->vocab_size);
    printf("context:       %d tokens; %s classifier\n", (int)c->seq_len, c->shared_classifier ? "shared" : "separate");
    printf("weights:       %zu bytes, f32\n", fgm_llama_weight_bytes(&m));
    printf("tokenizer:     a separate llama2.c tokenizer file (-z)\n");
    printf("fastgen:       can run it\n");
    fgm_llama_free(&m);
    return 0;
}

int cmd_info(int argc, char **argv) {
    if (argc == 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"))) {
        fputs(k_info_help, stdout);
        return 0;
    }
    if (argc != 1)
        return cli_usage("info", "expects one model file");
    return fgm_gguf_is_gguf(argv[0]) ? info_gguf(argv[0]) : info_llama2c(argv[0]);
}
