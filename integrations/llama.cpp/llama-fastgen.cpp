// fastgen inside llama.cpp (docs/llama.cpp.md).
//
// With --kv-compress SPEC, a context's memory is a fastgen context: every
// attention layer keeps its K and V only in fastgen's pages, each head under
// the policy its profile chose, and the graph's attention is one custom op
// per layer that hands the micro-batch's rows to fastgen:
//
//   a sequence's tokens in its first llama_decode are its prompt: every
//   micro-batch of them (one sequence's rows each, cut as that sequence
//   alone would be) is a chunk of fg_prefill_chunk (the last chunk profiles
//   and compresses every head);
//   later, one token of each of several sequences is one fg_decode (the
//   micro-batch's sequences together), and several tokens of one sequence
//   (a new user turn, the next n_batch of a long prompt) are fg_seq_append.
//
// A calibrated key scorer (`scorer=FILE` in the spec, fastgen calibrate's
// MODEL.fgscore; common's --kv-compress adds it for fastgen-adaptive when the
// file lies beside the model): the graph's "attn_norm" of each layer (the
// normed input its q, k and v are products of, noted by the patched
// llm_graph_context::cb) goes into the op as a fourth source; a prompt's rows
// are scored as they are prefilled, and after the last layer's last chunk
// every layer's scores are given (fg_seq_observe_scores) and the sequence
// compressed (fg_seq_compress): observe=scores, KVzap's idea, no second pass.
//
// A model with sliding-window layers (Gemma 3, ...): fastgen holds its global
// layers, and the sliding-window layers stay in a stock llama.cpp cache of
// their window (llama_kv_cache with the model's SWA filter, as llama.cpp's own
// iSWA cache makes it), kept by the same memory: their attention is stock
// llama.cpp's, over the cells the window keeps. A window is already a fixed
// small cache; fastgen's compression goes where the memory grows.
//
// llama.cpp's memory operations map onto fastgen's: removing a whole
// sequence destroys it, copying a whole sequence forks it (pages shared),
// keep destroys the others, clear destroys them all. What fastgen cannot do
// with a compressed cache (drop a range of positions, shift positions, save
// and restore a state) is refused with a log line: seq_rm returns false,
// can_shift is false, the state calls throw (llama.cpp reports 0 bytes).
//
// Threads: ggml runs a custom op on each of its threads. The first makes
// fastgen's calls; the others lend themselves to fastgen's pool for the
// op (fg_threadpool_lend), so fastgen's jobs run on llama.cpp's threads
// and no second set of threads competes with them for the cores. Each
// thread counts the ops it ran, so every thread names the same turn.

#include "llama-fastgen.h"

#include "llama-batch.h"
#include "llama-cparams.h"
#include "llama-graph.h"
#include "llama-hparams.h"
#include "llama-impl.h"
#include "llama-io.h"
#include "llama-kv-cache.h"
#include "llama-memory.h"
#include "llama-model.h"

#include "fastgen.h"
extern "C" {
#include "model/scorer.h" // the runner's scorer file and its dot products (fastgen's own sources)
}

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

class fastgen_memory;

// What the custom op of one layer reads when it runs: the memory, and which
// of fastgen's layers this one is.
struct layer_ref {
    fastgen_memory * mem;
    int32_t layer;
};

// One sequence's rows of the micro-batch being computed, and what fastgen does with them.
struct seq_state;

struct part {
    enum kind_t { PREFILL, DECODE, APPEND } kind;
    int32_t seq;                 // fastgen's id
    seq_state * state;           // its state (the memory's map keeps it in place while the batch runs)
    int32_t begin;               // PREFILL: the chunk's first row in the prompt
    std::vector<int32_t> rows;   // rows of the micro-batch, in order
    std::vector<int32_t> tokens; // their token ids
};

struct seq_state {
    int32_t seq = -1;             // fastgen's id
    std::vector<int32_t> prompt;  // the tokens of its first llama_decode
    int32_t n_done = 0;           // tokens applied: pos_max + 1
    std::vector<float> log_scores; // with a scorer, until compressed: [layers][KV heads][prompt] its keys' scores
};

void log_from_fastgen(void *, fg_log_level level, const char * message) {
    switch (level) {
        case FG_LOG_ERROR: LLAMA_LOG_ERROR("fastgen: %s\n", message); break;
        case FG_LOG_WARN:  LLAMA_LOG_WARN("fastgen: %s\n", message); break;
        case FG_LOG_INFO:  LLAMA_LOG_INFO("fastgen: %s\n", message); break;
        default:           LLAMA_LOG_DEBUG("fastgen: %s\n", message); break;
    }
}

class fastgen_memory_context;

class fastgen_memory : public llama_memory_i {
public:
    fastgen_memory(const llama_model & model, const llama_memory_params & params, const llama_cparams & cparams);
    ~fastgen_memory() override {
        fg_context_destroy(&ctx);
        fg_threadpool_destroy(&pool);
        fg_token_classes_destroy(&classes);
    }

    llama_memory_context_ptr init_batch(llama_batch_allocr & balloc, uint32_t n_ubatch, bool embd_all) override;
    llama_memory_context_ptr init_full() override;
    llama_memory_context_ptr init_update(llama_context * lctx, bool optimize) override;

    bool get_can_shift() const override { return false; }

    void clear(bool data) override;
    bool seq_rm(llama_seq_id seq_id, llama_pos p0, llama_pos p1) override;
    void seq_cp(llama_seq_id src, llama_seq_id dst, llama_pos p0, llama_pos p1) override;
    void seq_keep(llama_seq_id seq_id) override;
    void seq_add(llama_seq_id seq_id, llama_pos p0, llama_pos p1, llama_pos shift) override;
    void seq_div(llama_seq_id seq_id, llama_pos p0, llama_pos p1, int d) override;
    llama_pos seq_pos_min(llama_seq_id seq_id) const override;
    llama_pos seq_pos_max(llama_seq_id seq_id) const override;

    std::map<ggml_backend_buffer_type_t, size_t> memory_breakdown() const override;

    void state_write(llama_io_write_i &, llama_seq_id, llama_state_seq_flags) const override {
        throw std::runtime_error("fastgen: a compressed KV cache has no llama.cpp state to save");
    }
    void state_read(llama_io_read_i &, llama_seq_id, llama_state_seq_flags) override {
        throw std::runtime_error("fastgen: a compressed KV cache cannot load a llama.cpp state");
    }

    // the micro-batch about to be computed (from the memory context's apply)
    bool apply(const llama_ubatch & ubatch, const std::map<llama_seq_id, std::vector<int32_t>> & prompts);
    // one layer's attention of that micro-batch (from the custom op)
    // (x: the layer's normed input rows, with a scorer; else null)
    void run_layer(int32_t layer, const ggml_tensor * q, const ggml_tensor * k, const ggml_tensor * v,
                   const ggml_tensor * x, ggml_tensor * out);

    layer_ref * ref(int il) { return layer_of[il] >= 0 ? &refs[layer_of[il]] : nullptr; }
    bool kv_bytes(llama_seq_id seq_id, size_t * held, size_t * full) const;
    llama_kv_cache * swa_cache() const { return swa.get(); }

    int32_t n_q_heads = 0, n_kv_heads = 0, head_dim = 0;
    fg_threadpool * pool = nullptr;  // lent: llama.cpp's graph threads
    // a calibrated key scorer (observe=scores), or none (sc.w null); freed with the memory, or when the
    // constructor throws after loading it
    struct scorer_file {
        fgm_scorer sc = {};
        scorer_file() = default;
        scorer_file(const scorer_file &) = delete;
        scorer_file & operator=(const scorer_file &) = delete;
        ~scorer_file() { fgm_scorer_free(&sc); }
    } scorer;
    std::vector<ggml_tensor *> x_of; // [llama.cpp's layers] the graph being built: each layer's "attn_norm"
    std::vector<uint64_t> turns;     // [pool size] the ops each graph thread has run

private:
    void destroy(llama_seq_id seq_id);
    bool fail(const char * what);
    bool give_scores(seq_state & st);

    fg_context * ctx = nullptr;
    fg_token_classes * classes = nullptr;
    std::vector<int32_t> layer_of;  // llama.cpp's layer -> fastgen's, -1 for a layer it does not hold
    std::unique_ptr<llama_kv_cache> swa; // the sliding-window layers' stock cache, or null
    bool swa_streams = false;       // that cache keeps a stream per sequence (not --kv-unified)
    std::vector<layer_ref> refs;    // [fastgen's layers]
    std::map<llama_seq_id, seq_state> seqs;
    std::vector<part> plan;         // the micro-batch being computed
    std::vector<int32_t> dec_rows, dec_seqs, dec_tokens; // its decoding sequences: one fg_decode per layer
    std::vector<float> gq, gk, gv, gx, gout; // gathered rows
    std::vector<float> rope_factors;     // fastgen's rope_freq_factors, when the model scales positions
    std::string error;              // a failure inside the graph: the next call reports it
};

class fastgen_memory_context : public llama_memory_context_i {
public:
    explicit fastgen_memory_context(llama_memory_status status) : status(status) {}
    // swa: the same micro-batches in the sliding-window layers' cache (null when the model has none)
    fastgen_memory_context(fastgen_memory * mem, std::vector<llama_ubatch> ubatches,
                           std::map<llama_seq_id, std::vector<int32_t>> prompts,
                           std::unique_ptr<llama_kv_cache_context> swa) :
        status(LLAMA_MEMORY_STATUS_SUCCESS), mem(mem), swa(std::move(swa)), ubatches(std::move(ubatches)),
        prompts(std::move(prompts)) {}

    bool next() override {
        if (swa) {
            swa->next();
        }
        return ++i_cur < ubatches.size();
    }
    bool apply() override {
        if (!mem || ubatches.empty()) {
            return true;
        }
        return (!swa || swa->apply()) && mem->apply(ubatches[i_cur], prompts);
    }
    const llama_ubatch & get_ubatch() const override {
        static const llama_ubatch none = {};
        return ubatches.empty() ? none : ubatches[i_cur];
    }
    llama_memory_status get_status() const override { return status; }

    llama_memory_status status;
    fastgen_memory * mem = nullptr;
    std::unique_ptr<llama_kv_cache_context> swa;

private:
    std::vector<llama_ubatch> ubatches;
    std::map<llama_seq_id, std::vector<int32_t>> prompts; // the new sequences' prompts
    size_t i_cur = 0;
};

// The graph input of a fastgen memory: nothing to upload (the op reads the
// micro-batch from the memory, which apply() told), and always reusable.
class fastgen_input : public llm_graph_input_attn_kv {
public:
    fastgen_input(const llama_hparams & hparams, const llama_cparams & cparams) :
        llm_graph_input_attn_kv(hparams, cparams, nullptr) {}
    void set_input(const llama_ubatch *) override {}
    bool can_reuse(const llm_graph_params & params) override {
        return dynamic_cast<const fastgen_memory_context *>(params.mctx) != nullptr;
    }
    fastgen_memory * mem = nullptr;
};

// The sliding-window layers' input: llama.cpp's own over the SWA cache's
// context, which it follows from one micro-batch to the next.
class fastgen_swa_input : public llm_graph_input_attn_kv {
public:
    using llm_graph_input_attn_kv::llm_graph_input_attn_kv;
    bool can_reuse(const llm_graph_params & params) override {
        const auto * m = dynamic_cast<const fastgen_memory_context *>(params.mctx);
        if (!m || !m->swa) {
            return false;
        }
        llm_graph_params swa_params = params;
        swa_params.mctx = m->swa.get();
        return llm_graph_input_attn_kv::can_reuse(swa_params);
    }
};

// The input of a model with sliding-window layers: fastgen's for the global
// layers (nothing to upload), and the sliding-window layers' stock one.
class fastgen_input_iswa : public llm_graph_input_attn_kv_iswa {
public:
    fastgen_input_iswa(const llama_hparams & hparams, const llama_cparams & cparams) :
        llm_graph_input_attn_kv_iswa(hparams, cparams, nullptr) {}
    void set_input(const llama_ubatch *) override {}
    bool can_reuse(const llm_graph_params & params) override {
        return dynamic_cast<const fastgen_memory_context *>(params.mctx) != nullptr;
    }
    fastgen_memory * mem = nullptr;
    fastgen_swa_input * swa = nullptr; // owned by the graph's result, as every input
};

const char * ggml_type_to_fg(ggml_type t, fg_dtype * out) {
    switch (t) {
        case GGML_TYPE_F32:  *out = FG_DTYPE_F32;  return nullptr;
        case GGML_TYPE_F16:  *out = FG_DTYPE_F16;  return nullptr;
        case GGML_TYPE_BF16: *out = FG_DTYPE_BF16; return nullptr;
        case GGML_TYPE_Q8_0: *out = FG_DTYPE_Q8_0; return nullptr;
        case GGML_TYPE_Q4_0: *out = FG_DTYPE_Q4_0; return nullptr;
        default: return ggml_type_name(t);
    }
}

std::string refused(const std::string & why) {
    return "--kv-compress: " + why;
}

// The compression of a spec, or the reason it is refused (what no model could run). The glue's own
// option scorer=FILE (a path without ':') is taken out first, into *scorer; it means observe=scores.
std::string parse_spec(const char * spec, fg_compression_params * comp, std::string * scorer = nullptr) {
    if (!spec) {
        return refused("no spec");
    }
    std::string rest = spec, path;
    const size_t at = rest.find(":scorer=");
    if (at != std::string::npos) {
        const size_t from = at + strlen(":scorer="), end = rest.find(':', from);
        path = rest.substr(from, end == std::string::npos ? std::string::npos : end - from);
        rest.erase(at, end == std::string::npos ? std::string::npos : end - at);
        if (path.empty() || path == "-") { // (fastgen's file reader takes "-" for standard input)
            return refused("scorer= names no file");
        }
    }
    if (fg_compression_params_parse(rest.c_str(), comp) != FG_OK) {
        return refused(fg_last_error(nullptr));
    }
    const bool adaptive = comp->allocation == FG_ALLOC_ADAPTIVE;
    if (!path.empty()) {
        if (!adaptive) {
            return refused("scorer= ranks the keys of fastgen-adaptive (observe=scores); \"" + rest +
                           "\" is not fastgen-adaptive");
        }
        if (rest.find(":observe=") != std::string::npos && comp->observe != FG_OBSERVE_SCORES) {
            return refused("scorer= means observe=scores; the spec names another observation");
        }
        comp->observe = FG_OBSERVE_SCORES;
    }
    if (adaptive && comp->observe == FG_OBSERVE_EXPLICIT) {
        return refused("observe=reconstruct needs a reconstruction pass llama.cpp does not run; use observe=tail, "
                       "observe=predicted or a calibrated scorer (scorer=FILE)");
    }
    if (adaptive && comp->observe == FG_OBSERVE_SCORES && path.empty()) {
        return refused("observe=scores needs a calibrated key scorer: scorer=FILE (fastgen calibrate writes "
                       "MODEL.fgscore; with that file beside the model, fastgen-adaptive naming no observe= takes it)");
    }
    if (scorer) {
        *scorer = path;
    }
    return "";
}

fastgen_memory::fastgen_memory(const llama_model & model, const llama_memory_params & params,
                               const llama_cparams & cparams) {
    const llama_hparams & hp = model.hparams;
    const char * spec = params.kv_compress;

    // what fastgen's attention is: softmax(q k / sqrt(d)) v per head, causal,
    // one head size, every layer alike; anything else is refused by name
    if (llm_arch_is_recurrent(model.arch) || llm_arch_is_hybrid(model.arch)) {
        throw std::runtime_error(refused(std::string("model architecture ") + llm_arch_name(model.arch) +
                                         " keeps a recurrent state, not only a KV cache"));
    }
    if (hp.is_mla()) {
        throw std::runtime_error(refused("multi-head latent attention (MLA) is not softmax attention over "
                                         "cached K and V rows"));
    }
    if (hp.use_alibi || hp.f_max_alibi_bias != 0.0f) {
        throw std::runtime_error(refused("ALiBi adds a position bias fastgen's attention does not"));
    }
    if (hp.attn_soft_cap) {
        throw std::runtime_error(refused("attention logit soft-capping is not in fastgen's attention"));
    }
    if (hp.causal_attn == false) {
        throw std::runtime_error(refused("the model's attention is not causal"));
    }
    // the layers fastgen holds: every attention layer, or a sliding-window model's global ones (the
    // windowed ones stay in llama.cpp's SWA cache, below)
    const uint32_t n_layer = hp.n_layer();
    std::vector<uint32_t> held, windowed;
    for (uint32_t il = 0; il < n_layer; il++) {
        if (!hp.has_kv(il)) {
            throw std::runtime_error(refused("layer " + std::to_string(il) + " reads another layer's cache"));
        }
        (hp.swa_type != LLAMA_SWA_TYPE_NONE && hp.is_swa(il) ? windowed : held).push_back(il);
    }
    if (held.empty()) {
        throw std::runtime_error(refused(std::string("every layer of ") + llm_arch_name(model.arch) +
                                         " is sliding-window: no growing cache for fastgen to hold"));
    }
    const uint32_t l0 = held[0];
    for (uint32_t il : held) {
        if (hp.n_embd_head_k(il) != hp.n_embd_head_k(l0) || hp.n_embd_head_v(il) != hp.n_embd_head_k(l0) ||
            hp.n_head(il) != hp.n_head(l0) || hp.n_head_kv(il) != hp.n_head_kv(l0)) {
            throw std::runtime_error(refused("layers differ in head size or head count, or K and V differ in size"));
        }
    }
    n_q_heads = (int32_t) hp.n_head(l0);
    n_kv_heads = (int32_t) hp.n_head_kv(l0);
    head_dim = (int32_t) hp.n_embd_head_k(l0);

    fg_compression_params comp;
    std::string scorer_path;
    const std::string why = parse_spec(spec, &comp, &scorer_path);
    if (!why.empty()) {
        throw std::runtime_error(why);
    }
    if (!scorer_path.empty()) {
        char err[512];
        if (fgm_scorer_load(scorer_path.c_str(), &scorer.sc, err, sizeof err) != FG_OK) {
            throw std::runtime_error(refused(err));
        }
        const fgm_scorer & sc = scorer.sc;
        if (sc.n_layers != (int32_t) held.size() || sc.n_kv_heads != n_kv_heads || sc.dim != (int32_t) hp.n_embd) {
            throw std::runtime_error(refused(scorer_path + " scores " + std::to_string(sc.n_layers) +
                                             " layers of " + std::to_string(sc.n_kv_heads) +
                                             " KV heads from rows of " + std::to_string(sc.dim) +
                                             "; this model's fastgen layers: " + std::to_string(held.size()) +
                                             " of " + std::to_string(n_kv_heads) + " KV heads, rows of " +
                                             std::to_string(hp.n_embd) + " (a scorer of another model)"));
        }
        x_of.assign(n_layer, nullptr);
        LLAMA_LOG_INFO("%s: fastgen-adaptive ranks a prompt's keys by the scorer %s (observe=scores, fitted on %d "
                       "tokens): one %d-long dot a row and KV head per layer at prefill, no second pass\n", __func__,
                       scorer_path.c_str(), (int) sc.calib_tokens, (int) sc.dim);
    }
    fg_dtype kt = FG_DTYPE_F16, vt = FG_DTYPE_F16;
    if (const char * bad = ggml_type_to_fg(params.type_k, &kt)) {
        throw std::runtime_error(refused(std::string("-ctk ") + bad + ": fastgen stores f32, f16, bf16, q8_0, q4_0"));
    }
    if (const char * bad = ggml_type_to_fg(params.type_v, &vt)) {
        throw std::runtime_error(refused(std::string("-ctv ") + bad + ": fastgen stores f32, f16, bf16, q8_0, q4_0"));
    }

    // token classes: punctuation from each token's text, control tokens special
    const llama_vocab * vocab = llama_model_get_vocab(&model);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    {
        std::vector<std::string> text(n_vocab);
        std::vector<const char *> pieces(n_vocab);
        char buf[256];
        for (int32_t id = 0; id < n_vocab; id++) {
            const int32_t n = llama_token_to_piece(vocab, id, buf, sizeof buf, 0, false);
            text[id] = n > 0 ? std::string(buf, n) : std::string();
            pieces[id] = text[id].c_str();
        }
        if (fg_token_classes_create(n_vocab, pieces.data(), &classes) != FG_OK) {
            throw std::runtime_error(refused(fg_last_error(nullptr)));
        }
        for (int32_t id = 0; id < n_vocab; id++) {
            if (llama_vocab_get_attr(vocab, id) & LLAMA_TOKEN_ATTR_CONTROL) {
                fg_token_classes_set(classes, id, FG_TOKEN_SPECIAL);
            }
        }
    }

    layer_of.assign(n_layer, -1);
    for (uint32_t il : held) {
        layer_of[il] = (int32_t) refs.size();
        refs.push_back({this, (int32_t) refs.size()});
    }
    if (!windowed.empty()) { // sized as llama.cpp's iSWA cache sizes its SWA half
        swa_streams = !cparams.kv_unified;
        const uint32_t cells = GGML_PAD(std::min(cparams.n_ctx_seq, hp.n_swa * (cparams.kv_unified ? cparams.n_seq_max : 1) +
                                                                     cparams.n_ubatch), 256);
        swa = std::make_unique<llama_kv_cache>(model, hp, params.type_k, params.type_v, !cparams.flash_attn,
                                               cparams.offload_kqv, cparams.kv_unified, cells, cparams.n_seq_max, 1,
                                               hp.n_swa, hp.swa_type, nullptr,
                                               [&hp](int32_t il) { return hp.is_swa((uint32_t) il); }, nullptr,
                                               nullptr);
        std::string list;
        for (uint32_t il : windowed) {
            list += (list.empty() ? "" : ",") + std::to_string(il);
        }
        std::string mine;
        for (uint32_t il : held) {
            mine += (mine.empty() ? "" : ",") + std::to_string(il);
        }
        LLAMA_LOG_INFO("%s: sliding-window layers %s (window %u) stay in llama.cpp's SWA cache (%u cells%s); "
                       "fastgen holds the global layers %s\n", __func__, list.c_str(), hp.n_swa, cells,
                       swa_streams ? " per sequence" : "", mine.c_str());
    }

    fg_context_params p;
    fg_context_params_default(&p);
    p.backend = "cpu";
    p.n_layers = (int32_t) refs.size();
    p.n_q_heads = n_q_heads;
    p.n_kv_heads = n_kv_heads;
    p.head_dim = head_dim;
    p.kv_dtype = kt;
    p.v_dtype = vt;
    p.max_seqs = std::max<int32_t>(1, (int32_t) cparams.n_seq_max) * 2; // forks (n > 1 completions) beside
    p.max_seq_len = (int32_t) cparams.n_ctx_seq;
    const int32_t n_threads = std::max<int32_t>(1, std::max(cparams.n_threads, cparams.n_threads_batch));
    if (fg_threadpool_create_lent(n_threads, &pool) != FG_OK) {
        throw std::runtime_error(refused(fg_last_error(nullptr)));
    }
    turns.assign(n_threads, 0);
    p.threadpool = pool;
    p.classes = classes;
    p.log_fn = log_from_fastgen;
    // the RoPE of the layers fastgen holds (a linear scale is a frequency factor of 1 / scale on every pair)
    const float theta = model.get_rope_freq_base(cparams, (int) l0), scale = model.get_rope_freq_scale(cparams, (int) l0);
    p.rope_theta = theta > 1.0f ? theta : 0.0f;
    p.rope_dims = (int32_t) hp.n_rot(l0);
    if (scale > 0.0f && scale != 1.0f) {
        rope_factors.assign((size_t) p.rope_dims / 2, 1.0f / scale);
        p.rope_freq_factors = rope_factors.data();
    }
    p.rope_style = llama_model_rope_type(&model) == LLAMA_ROPE_TYPE_NEOX ? FG_ROPE_HALVES : FG_ROPE_ADJACENT;
    if (fg_context_create(&p, &ctx) != FG_OK || fg_context_set_compression(ctx, &comp) != FG_OK) {
        throw std::runtime_error(refused(fg_last_error(ctx)));
    }
    LLAMA_LOG_INFO("%s: KV cache in fastgen's pages (%s, backend %s): %u layers, %d KV heads of %d, "
                   "K %s, V %s, %d sequences of up to %d tokens; held bytes grow with what each head keeps\n",
                   __func__, spec, fg_context_backend(ctx), (unsigned) refs.size(), n_kv_heads, head_dim, fg_dtype_name(kt),
                   fg_dtype_name(vt), (int) cparams.n_seq_max, (int) cparams.n_ctx_seq);
    LLAMA_LOG_INFO("%s: a compressed cache cannot drop a range of positions, shift them, or save a state: "
                   "those requests are refused (context shift and prompt-cache reuse are off)\n", __func__);
}

bool fastgen_memory::fail(const char * what) {
    error = std::string(what) + ": " + fg_last_error(ctx);
    LLAMA_LOG_ERROR("fastgen: %s\n", error.c_str());
    return false;
}

llama_memory_context_ptr fastgen_memory::init_batch(llama_batch_allocr & balloc, uint32_t n_ubatch, bool) {
    if (!error.empty()) {
        LLAMA_LOG_ERROR("fastgen: an earlier step failed (%s); clear the memory or the sequences\n", error.c_str());
        return std::make_unique<fastgen_memory_context>(LLAMA_MEMORY_STATUS_FAILED_PREPARE);
    }
    const llama_batch & b = balloc.get_batch();
    if (!b.token) {
        LLAMA_LOG_ERROR("fastgen: a batch of embeddings has no token ids to classify\n");
        return std::make_unique<fastgen_memory_context>(LLAMA_MEMORY_STATUS_FAILED_PREPARE);
    }
    // a new sequence's tokens in this batch are its prompt, from position 0
    std::map<llama_seq_id, std::vector<int32_t>> prompts;
    for (int32_t i = 0; i < b.n_tokens; i++) {
        if (b.n_seq_id[i] != 1) {
            LLAMA_LOG_ERROR("fastgen: a token shared by %d sequences (each sequence keeps its own compressed "
                            "cache)\n", b.n_seq_id[i]);
            return std::make_unique<fastgen_memory_context>(LLAMA_MEMORY_STATUS_FAILED_PREPARE);
        }
        const llama_seq_id s = b.seq_id[i][0];
        if (seqs.count(s)) {
            continue;
        }
        auto & pr = prompts[s];
        if (pr.empty() && b.pos[i] != 0) {
            LLAMA_LOG_ERROR("fastgen: sequence %d starts at position %d, not 0\n", s, b.pos[i]);
            return std::make_unique<fastgen_memory_context>(LLAMA_MEMORY_STATUS_FAILED_PREPARE);
        }
        pr.push_back(b.token[i]);
    }
    // one token of each sequence: one micro-batch of them all (a batched decode step); else each
    // micro-batch holds one sequence's rows, cut at n_ubatch as that sequence alone would be, so a
    // request's prompt is computed alike whether others are served beside it or not
    std::map<llama_seq_id, int32_t> per_seq;
    for (int32_t i = 0; i < b.n_tokens; i++) {
        per_seq[b.seq_id[i][0]]++;
    }
    bool one_each = true;
    for (auto & [s, n] : per_seq) {
        one_each = one_each && n == 1;
    }
    balloc.split_reset();
    std::vector<llama_ubatch> ubatches;
    for (;;) {
        // (a SWA cache with a stream per sequence takes them in increasing order, as llama.cpp's own)
        llama_ubatch u = one_each ? balloc.split_equal(n_ubatch, swa_streams, 0) : balloc.split_seq(n_ubatch);
        if (u.n_tokens == 0) {
            break;
        }
        ubatches.push_back(std::move(u));
    }
    if (balloc.get_n_used() < balloc.get_n_tokens()) {
        return std::make_unique<fastgen_memory_context>(LLAMA_MEMORY_STATUS_FAILED_PREPARE);
    }
    std::unique_ptr<llama_kv_cache_context> swa_ctx;
    if (swa) { // the sliding-window layers' cells for the same micro-batches
        auto sinfos = swa->prepare(ubatches);
        if (sinfos.empty()) {
            return std::make_unique<fastgen_memory_context>(LLAMA_MEMORY_STATUS_FAILED_PREPARE);
        }
        swa_ctx = std::make_unique<llama_kv_cache_context>(swa.get(), std::move(sinfos), ubatches);
    }
    return std::make_unique<fastgen_memory_context>(this, std::move(ubatches), std::move(prompts), std::move(swa_ctx));
}

llama_memory_context_ptr fastgen_memory::init_full() {
    return std::make_unique<fastgen_memory_context>(this, std::vector<llama_ubatch>(),
                                                    std::map<llama_seq_id, std::vector<int32_t>>(),
                                                    swa ? std::make_unique<llama_kv_cache_context>(swa.get()) : nullptr);
}

llama_memory_context_ptr fastgen_memory::init_update(llama_context * lctx, bool optimize) {
    // the SWA cache's own pending work (a sequence copied between its streams)
    return swa ? swa->init_update(lctx, optimize) : std::make_unique<fastgen_memory_context>(LLAMA_MEMORY_STATUS_NO_UPDATE);
}

bool fastgen_memory::apply(const llama_ubatch & u, const std::map<llama_seq_id, std::vector<int32_t>> & prompts) {
    if (!error.empty()) {
        return false;
    }
    plan.clear();
    std::map<llama_seq_id, size_t> at; // sequence -> its part
    for (uint32_t i = 0; i < u.n_tokens; i++) {
        const llama_seq_id s = u.seq_id[i][0];
        auto it = at.find(s);
        if (it == at.end()) {
            auto st = seqs.find(s);
            if (st == seqs.end()) { // its first micro-batch: the sequence starts
                auto pr = prompts.find(s);
                if (pr == prompts.end()) {
                    LLAMA_LOG_ERROR("fastgen: sequence %d has no prompt\n", s);
                    return false;
                }
                seq_state ns;
                ns.prompt = pr->second;
                if (fg_seq_create(ctx, nullptr, ns.prompt.data(), (int32_t) ns.prompt.size(), &ns.seq) != FG_OK) {
                    return fail("fg_seq_create");
                }
                if (scorer.sc.w) {
                    ns.log_scores.assign(refs.size() * (size_t) n_kv_heads * ns.prompt.size(), 0.0f);
                }
                st = seqs.emplace(s, std::move(ns)).first;
            }
            part p;
            p.seq = st->second.seq;
            p.state = &st->second;
            p.begin = st->second.n_done;
            p.kind = p.begin < (int32_t) st->second.prompt.size() ? part::PREFILL : part::DECODE;
            at[s] = plan.size();
            plan.push_back(std::move(p));
            it = at.find(s);
        }
        part & p = plan[it->second];
        p.rows.push_back((int32_t) i);
        p.tokens.push_back(u.token[i]);
    }
    for (auto & [s, i] : at) { // checked before any sequence advances
        const part & p = plan[i];
        if (p.kind == part::PREFILL && p.begin + (int32_t) p.rows.size() > (int32_t) seqs[s].prompt.size()) {
            LLAMA_LOG_ERROR("fastgen: sequence %d: a micro-batch runs past its prompt\n", s);
            return false;
        }
    }
    for (auto & [s, i] : at) {
        part & p = plan[i];
        if (p.kind == part::DECODE && p.rows.size() > 1) {
            p.kind = part::APPEND;
        }
        seqs[s].n_done += (int32_t) p.rows.size();
    }
    dec_rows.clear();
    dec_seqs.clear();
    dec_tokens.clear();
    for (const part & p : plan) {
        if (p.kind == part::DECODE) {
            dec_rows.push_back(p.rows[0]);
            dec_seqs.push_back(p.seq);
            dec_tokens.push_back(p.tokens[0]);
        }
    }
    return true;
}

// whether rows follow each other (the tensors' rows are then used where they lie)
static bool consecutive(const std::vector<int32_t> & rows) {
    for (size_t i = 1; i < rows.size(); i++) {
        if (rows[i] != rows[i - 1] + 1) {
            return false;
        }
    }
    return true;
}

// rows of src ([n_tokens][heads][d] floats) into dst, in the order given
static const float * gather(const ggml_tensor * src, const std::vector<int32_t> & rows, int32_t heads, int32_t d,
                            std::vector<float> & dst) {
    const size_t w = (size_t) heads * d;
    const float * base = (const float *) src->data;
    if (consecutive(rows)) {
        return base + (size_t) rows[0] * w;
    }
    dst.resize(rows.size() * w);
    for (size_t i = 0; i < rows.size(); i++) {
        memcpy(dst.data() + i * w, base + (size_t) rows[i] * w, w * sizeof(float));
    }
    return dst.data();
}

// observe=scores: every layer's scores of a prefilled prompt's keys, then its compression
bool fastgen_memory::give_scores(seq_state & st) {
    const size_t n = st.prompt.size(), per_layer = (size_t) n_kv_heads * n;
    std::vector<float> buf(per_layer);
    for (size_t l = 0; l < refs.size(); l++) {
        const float * ls = st.log_scores.data() + l * per_layer;
        for (size_t i = 0; i < per_layer; i++) { // the log-score bounded so that exp stays finite (as the runner)
            buf[i] = std::exp(std::min(80.0f, std::max(-80.0f, ls[i])));
        }
        if (fg_seq_observe_scores(ctx, st.seq, (int32_t) l, buf.data(), (int32_t) n) != FG_OK) {
            return fail("fg_seq_observe_scores");
        }
    }
    std::vector<float>().swap(st.log_scores);
    return fg_seq_compress(ctx, st.seq) == FG_OK || fail("fg_seq_compress");
}

void fastgen_memory::run_layer(int32_t layer, const ggml_tensor * q, const ggml_tensor * k, const ggml_tensor * v,
                               const ggml_tensor * x, ggml_tensor * out) {
    const size_t wq = (size_t) n_q_heads * head_dim;
    float * obase = (float *) out->data;
    bool ok = error.empty();
    // the decoding sequences' rows as one step (dec_*, from apply), then the others one by one
    const std::vector<int32_t> & rows = dec_rows;
    auto scatter = [&](const std::vector<int32_t> & r, const float * src) {
        for (size_t i = 0; i < r.size(); i++) {
            if (obase + (size_t) r[i] * wq != src + i * wq) {
                memcpy(obase + (size_t) r[i] * wq, src + i * wq, wq * sizeof(float));
            }
        }
    };
    auto out_for = [&](const std::vector<int32_t> & r) {
        if (consecutive(r)) {
            return obase + (size_t) r[0] * wq;
        }
        gout.resize(r.size() * wq);
        return gout.data();
    };
    if (ok && !rows.empty()) {
        const float * pq = gather(q, rows, n_q_heads, head_dim, gq);
        const float * pk = gather(k, rows, n_kv_heads, head_dim, gk);
        const float * pv = gather(v, rows, n_kv_heads, head_dim, gv);
        float * po = out_for(rows);
        ok = fg_decode(ctx, layer, (int32_t) rows.size(), dec_seqs.data(), dec_tokens.data(), pq, pk, pv, po) == FG_OK ||
             fail("fg_decode");
        if (ok) {
            scatter(rows, po);
        }
    }
    for (const part & p : plan) {
        if (!ok || p.kind == part::DECODE) {
            continue;
        }
        const float * pq = gather(q, p.rows, n_q_heads, head_dim, gq);
        const float * pk = gather(k, p.rows, n_kv_heads, head_dim, gk);
        const float * pv = gather(v, p.rows, n_kv_heads, head_dim, gv);
        float * po = out_for(p.rows);
        const int32_t n = (int32_t) p.rows.size();
        if (p.kind == part::PREFILL) {
            seq_state * st = p.state;
            if (scorer.sc.w && !x) { // build_fastgen_attn found no normed input for this layer
                error = "fastgen layer " + std::to_string(layer) + ": the model's graph names no \"attn_norm\" (an "
                        "f32 row of " + std::to_string(scorer.sc.dim) + " a token) for the scorer";
                LLAMA_LOG_ERROR("fastgen: %s\n", error.c_str());
                ok = false;
                break;
            }
            if (x) { // the chunk's keys scored (its rows of the layer's normed input)
                const size_t n_prompt = st->prompt.size();
                const float * px = gather(x, p.rows, 1, scorer.sc.dim, gx);
                fgm_scorer_predict(&scorer.sc, layer, px, n,
                                   st->log_scores.data() + (size_t) layer * n_kv_heads * n_prompt, n_prompt, p.begin);
            }
            ok = fg_prefill_chunk(ctx, p.seq, layer, p.begin, n, pq, pk, pv, po) == FG_OK || fail("fg_prefill_chunk");
            if (ok && x && layer + 1 == (int32_t) refs.size() && p.begin + n == (int32_t) st->prompt.size()) {
                ok = give_scores(*st); // the prompt's last chunk through every layer
            }
        } else {
            ok = fg_seq_append(ctx, p.seq, layer, p.tokens.data(), n, pq, pk, pv, po) == FG_OK ||
                 fail("fg_seq_append");
        }
        if (ok) {
            scatter(p.rows, po);
        }
    }
    if (!ok) { // the step is lost: its output says so, and the next call reports it
        const size_t n = (size_t) ggml_nelements(out);
        std::fill(obase, obase + n, std::numeric_limits<float>::quiet_NaN());
    }
}

void fastgen_memory::destroy(llama_seq_id s) {
    auto it = seqs.find(s);
    if (it != seqs.end()) {
        fg_seq_destroy(ctx, it->second.seq);
        seqs.erase(it);
    }
    if (swa) {
        swa->seq_rm(s, -1, -1);
    }
}

void fastgen_memory::clear(bool data) {
    for (auto & [s, st] : seqs) {
        fg_seq_destroy(ctx, st.seq);
    }
    seqs.clear();
    plan.clear();
    error.clear(); // every cache is gone, a failed one too
    if (swa) {
        swa->clear(data);
    }
    if (data) {
        fg_trim(ctx);
    }
}

bool fastgen_memory::seq_rm(llama_seq_id seq_id, llama_pos p0, llama_pos p1) {
    if (p0 < 0) {
        p0 = 0;
    }
    if (p1 < 0) {
        p1 = std::numeric_limits<llama_pos>::max();
    }
    std::vector<llama_seq_id> ids;
    if (seq_id < 0) {
        for (auto & [s, st] : seqs) {
            ids.push_back(s);
        }
    } else if (seqs.count(seq_id)) {
        ids.push_back(seq_id);
    }
    for (llama_seq_id s : ids) { // all or nothing
        const llama_pos end = seqs[s].n_done;
        if (p0 < end && !(p0 == 0 && p1 >= end)) {
            LLAMA_LOG_WARN("fastgen: refused to remove positions [%d, %d) of sequence %d (it holds %d): a "
                           "compressed cache keeps rows by policy, and drops only a whole sequence\n",
                           p0, p1, s, end);
            return false;
        }
    }
    for (llama_seq_id s : ids) {
        if (p0 == 0) {
            destroy(s);
        }
    }
    if (swa) { // what fastgen held is gone or never was: the window cache drops the same positions (a rolled
               // back micro-batch's cells among them)
        swa->seq_rm(seq_id, p0, p1);
    }
    return true;
}

void fastgen_memory::seq_cp(llama_seq_id src, llama_seq_id dst, llama_pos p0, llama_pos p1) {
    if (src == dst || !seqs.count(src)) {
        return;
    }
    const seq_state & from = seqs[src];
    if (p0 > 0 || (p1 >= 0 && p1 < from.n_done)) {
        LLAMA_LOG_WARN("fastgen: refused to copy positions [%d, %d) of sequence %d: only a whole sequence "
                       "is copied (forked)\n", p0, p1, src);
        return;
    }
    int32_t child = -1;
    if (fg_seq_fork(ctx, from.seq, &child) != FG_OK) {
        LLAMA_LOG_ERROR("fastgen: copying sequence %d to %d: %s\n", src, dst, fg_last_error(ctx));
        return;
    }
    destroy(dst);
    if (swa) {
        swa->seq_cp(src, dst, -1, -1);
    }
    seq_state st = seqs[src];
    st.seq = child;
    seqs[dst] = std::move(st);
}

void fastgen_memory::seq_keep(llama_seq_id seq_id) {
    std::vector<llama_seq_id> others;
    for (auto & [s, st] : seqs) {
        if (s != seq_id) {
            others.push_back(s);
        }
    }
    for (llama_seq_id s : others) {
        destroy(s);
    }
    if (swa) {
        swa->seq_keep(seq_id);
    }
}

void fastgen_memory::seq_add(llama_seq_id seq_id, llama_pos p0, llama_pos p1, llama_pos shift) {
    if (shift != 0 && seqs.count(seq_id)) {
        LLAMA_LOG_WARN("fastgen: refused to shift positions [%d, %d) of sequence %d by %d: a compressed cache's "
                       "rows keep the positions they were encoded at\n", p0, p1, seq_id, shift);
    }
}

void fastgen_memory::seq_div(llama_seq_id seq_id, llama_pos p0, llama_pos p1, int d) {
    if (d != 1 && seqs.count(seq_id)) {
        LLAMA_LOG_WARN("fastgen: refused to divide positions [%d, %d) of sequence %d by %d\n", p0, p1, seq_id, d);
    }
}

llama_pos fastgen_memory::seq_pos_min(llama_seq_id seq_id) const {
    auto it = seqs.find(seq_id);
    return it == seqs.end() || it->second.n_done == 0 ? -1 : 0;
}

llama_pos fastgen_memory::seq_pos_max(llama_seq_id seq_id) const {
    auto it = seqs.find(seq_id);
    return it == seqs.end() ? -1 : it->second.n_done - 1;
}

std::map<ggml_backend_buffer_type_t, size_t> fastgen_memory::memory_breakdown() const {
    fg_memory_stats m = {};
    fg_memory(ctx, -1, &m);
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    std::map<ggml_backend_buffer_type_t, size_t> mb = {{ggml_backend_dev_buffer_type(cpu), m.pool_bytes}};
    if (swa) {
        for (const auto & [buft, size] : swa->memory_breakdown()) {
            mb[buft] += size;
        }
    }
    return mb;
}

bool fastgen_memory::kv_bytes(llama_seq_id seq_id, size_t * held, size_t * full) const {
    fg_memory_stats m = {};
    int32_t seq = -1;
    if (seq_id >= 0) {
        auto it = seqs.find(seq_id);
        if (it == seqs.end()) {
            *held = *full = 0;
            return true;
        }
        seq = it->second.seq;
    }
    if (fg_memory(ctx, seq, &m) != FG_OK) {
        return false;
    }
    *held = m.kv_bytes_held;
    *full = m.kv_bytes_full;
    return true;
}

void attention_op(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const layer_ref * ref = (const layer_ref *) userdata;
    fastgen_memory * mem = ref->mem;
    // a graph with as many threads as the pool lends them (each counts its turn); another runs on the first alone
    const bool lend = nth == fg_threadpool_size(mem->pool);
    const uint64_t ticket = lend ? ++mem->turns[ith] : 0;
    if (ith != 0) {
        if (lend) {
            fg_threadpool_lend(mem->pool, ith, ticket);
        }
        return;
    }
    mem->run_layer(ref->layer, dst->src[0], dst->src[1], dst->src[2], dst->src[3], dst);
    if (lend) {
        fg_threadpool_release(mem->pool, ticket);
    }
}

// One fastgen layer's attention in the graph: the custom op, then wo and wo_b as llama.cpp applies them.
ggml_tensor * build_fastgen_attn(const llm_graph_context & g, fastgen_memory * mem, ggml_tensor * wo,
                                 ggml_tensor * wo_b, ggml_tensor * wo_s, ggml_tensor * q_cur, ggml_tensor * k_cur,
                                 ggml_tensor * v_cur, ggml_tensor * kq_b, ggml_tensor * sinks, ggml_tensor * v_mla,
                                 float kq_scale, int il) {
    layer_ref * ref = mem->ref(il);
    GGML_ASSERT(ref && "fastgen: a layer it does not hold");
    GGML_ASSERT(!kq_b && !sinks && !v_mla && "fastgen: attention bias, sinks or MLA (refused at start-up)");
    ggml_context * ctx0 = g.ctx0;
    // fastgen scales q.k by 1/sqrt(d): a model's own scale goes into q
    const float unit = 1.0f / std::sqrt((float) mem->head_dim);
    if (std::fabs(kq_scale - unit) > 1e-6f * unit) {
        q_cur = ggml_scale(ctx0, q_cur, kq_scale / unit);
    }
    auto f32 = [&](ggml_tensor * t, int32_t heads) {
        if (t->type != GGML_TYPE_F32) {
            t = ggml_cast(ctx0, t, GGML_TYPE_F32);
        } else if (!ggml_is_contiguous(t)) {
            t = ggml_cont(ctx0, t);
        }
        return ggml_reshape_3d(ctx0, t, mem->head_dim, heads, ggml_nelements(t) / ((int64_t) mem->head_dim * heads));
    };
    ggml_tensor * args[4] = {f32(q_cur, mem->n_q_heads), f32(k_cur, mem->n_kv_heads), f32(v_cur, mem->n_kv_heads),
                             nullptr};
    const int64_t n_tokens = args[0]->ne[2];
    int n_args = 3;
    if (mem->scorer.sc.w) { // the layer's normed input, for the scorer (noted by llama_fastgen_note_tensor)
        ggml_tensor * x = mem->x_of[il];
        mem->x_of[il] = nullptr;
        if (x && x->type == GGML_TYPE_F32 && x->ne[0] == mem->scorer.sc.dim && ggml_nelements(x) == x->ne[0] * n_tokens) {
            args[n_args++] = ggml_is_contiguous(x) ? x : ggml_cont(ctx0, x);
        } // else the op fails a prompt's step with the reason (run_layer), and the next batch is refused
    }
    ggml_tensor * cur = ggml_custom_4d(ctx0, GGML_TYPE_F32, (int64_t) mem->head_dim * mem->n_q_heads, n_tokens, 1,
                                       1, args, n_args, attention_op, GGML_N_TASKS_MAX, ref);
    g.cb(cur, "kqv_out", il);
    if (wo) {
        cur = g.build_lora_mm(wo, cur, wo_s);
    }
    if (wo_b) {
        cur = ggml_add(ctx0, cur, wo_b);
    }
    return cur;
}

} // namespace

llama_memory_i * llama_fastgen_create_memory(const llama_model & model, const llama_memory_params & params,
                                             const llama_cparams & cparams) {
    return new fastgen_memory(model, params, cparams);
}

llm_graph_input_attn_kv * llama_fastgen_build_inp(const llm_graph_context & g) {
    const auto * mctx = dynamic_cast<const fastgen_memory_context *>(g.mctx);
    if (!mctx) {
        return nullptr;
    }
    auto inp = std::make_unique<fastgen_input>(g.hparams, g.cparams);
    inp->mem = mctx->mem;
    return (llm_graph_input_attn_kv *) g.res->add_input(std::move(inp));
}

ggml_tensor * llama_fastgen_build_attn(const llm_graph_context & g, llm_graph_input_attn_kv * inp_kv, ggml_tensor * wo,
                                       ggml_tensor * wo_b, ggml_tensor * wo_s, ggml_tensor * q_cur,
                                       ggml_tensor * k_cur, ggml_tensor * v_cur, ggml_tensor * kq_b,
                                       ggml_tensor * sinks, ggml_tensor * v_mla, float kq_scale, int il) {
    auto * inp = dynamic_cast<fastgen_input *>(inp_kv);
    return inp ? build_fastgen_attn(g, inp->mem, wo, wo_b, wo_s, q_cur, k_cur, v_cur, kq_b, sinks, v_mla, kq_scale, il)
               : nullptr;
}

llm_graph_input_attn_kv_iswa * llama_fastgen_build_inp_iswa(const llm_graph_context & g) {
    const auto * mctx = dynamic_cast<const fastgen_memory_context *>(g.mctx);
    if (!mctx) {
        return nullptr;
    }
    GGML_ASSERT(mctx->swa && "fastgen: a sliding-window graph on a memory without a SWA cache");
    // the sliding-window layers' input, as llama.cpp builds its own over a cache context
    const llama_kv_cache_context * kv = mctx->swa.get();
    auto swa = std::make_unique<fastgen_swa_input>(g.hparams, g.cparams, kv);
    swa->self_k_idxs = kv->build_input_k_idxs(g.ctx0, g.ubatch);
    swa->self_v_idxs = kv->build_input_v_idxs(g.ctx0, g.ubatch);
    const int64_t n_stream = g.cparams.kv_unified ? 1 : g.ubatch.n_seqs_unq;
    swa->self_kq_mask = ggml_new_tensor_4d(g.ctx0, g.cparams.flash_attn ? GGML_TYPE_F16 : GGML_TYPE_F32, kv->get_n_kv(),
                                           g.ubatch.n_tokens / n_stream, 1, n_stream);
    ggml_set_input(swa->self_kq_mask);
    ggml_set_name(swa->self_kq_mask, "attn_inp_kq_mask_swa");
    swa->self_kq_mask_cnv = swa->self_kq_mask;
    swa->self_k_rot = kv->build_input_k_rot(g.ctx0);
    swa->self_v_rot = kv->build_input_v_rot(g.ctx0);

    auto inp = std::make_unique<fastgen_input_iswa>(g.hparams, g.cparams);
    inp->mem = mctx->mem;
    inp->swa = (fastgen_swa_input *) g.res->add_input(std::move(swa));
    return (llm_graph_input_attn_kv_iswa *) g.res->add_input(std::move(inp));
}

ggml_tensor * llama_fastgen_build_attn_iswa(const llm_graph_context & g, llm_graph_input_attn_kv_iswa * inp_kv,
                                            ggml_tensor * wo, ggml_tensor * wo_b, ggml_tensor * wo_s,
                                            ggml_tensor * q_cur, ggml_tensor * k_cur, ggml_tensor * v_cur,
                                            ggml_tensor * kq_b, ggml_tensor * sinks, ggml_tensor * v_mla,
                                            float kq_scale, int il) {
    auto * inp = dynamic_cast<fastgen_input_iswa *>(inp_kv);
    if (!inp) {
        return nullptr;
    }
    if (g.hparams.is_swa((uint32_t) il)) { // llama.cpp's own attention over the SWA cache
        return g.build_attn(inp->swa, wo, wo_b, wo_s, q_cur, k_cur, v_cur, kq_b, sinks, v_mla, kq_scale, il);
    }
    return build_fastgen_attn(g, inp->mem, wo, wo_b, wo_s, q_cur, k_cur, v_cur, kq_b, sinks, v_mla, kq_scale, il);
}

void llama_fastgen_note_tensor(const llm_graph_context & g, ggml_tensor * cur, const char * name, int il) {
    if (strcmp(name, "attn_norm") != 0 || il < 0) {
        return;
    }
    const auto * mctx = dynamic_cast<const fastgen_memory_context *>(g.mctx);
    if (mctx && mctx->mem && mctx->mem->scorer.sc.w && (size_t) il < mctx->mem->x_of.size()) {
        mctx->mem->x_of[il] = cur;
    }
}

bool llama_memory_kv_bytes(llama_memory_t mem, llama_seq_id seq_id, size_t * held, size_t * full) {
    const auto * fg = dynamic_cast<const fastgen_memory *>(mem);
    return fg && held && full && fg->kv_bytes(seq_id, held, full);
}

const char * llama_kv_compress_error(const char * spec) {
    static thread_local std::string why;
    fg_compression_params comp;
    why = parse_spec(spec, &comp);
    return why.empty() ? nullptr : why.c_str();
}
