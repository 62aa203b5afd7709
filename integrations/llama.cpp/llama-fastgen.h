// fastgen inside llama.cpp: the calls llama.cpp's sources make into the glue
// (llama-fastgen.cpp), declared here so the patch adds one include and a few
// lines per hook. Built into libllama when LLAMA_FASTGEN is on.
#pragma once

#include <cstddef>

struct ggml_tensor;
struct llama_cparams;
struct llama_memory_i;
struct llama_memory_params;
struct llama_model;
struct llm_graph_context;
class llm_graph_input_attn_kv;
class llm_graph_input_attn_kv_iswa;

// The memory of a context created with --kv-compress SPEC (params.kv_compress):
// every attention layer's K and V in a fastgen context. Throws
// std::runtime_error with the reason when the model or the spec cannot run
// (llama.cpp then refuses the context with that message).
llama_memory_i * llama_fastgen_create_memory(const llama_model & model, const llama_memory_params & params,
                                             const llama_cparams & cparams);

// build_attn_inp_kv's input when the graph's memory is fastgen's, else nullptr.
llm_graph_input_attn_kv * llama_fastgen_build_inp(const llm_graph_context & g);

// build_attn for a fastgen input (its attention, then wo and wo_b as llama.cpp
// applies them), else nullptr.
ggml_tensor * llama_fastgen_build_attn(const llm_graph_context & g, llm_graph_input_attn_kv * inp, ggml_tensor * wo,
                                       ggml_tensor * wo_b, ggml_tensor * wo_s, ggml_tensor * q_cur,
                                       ggml_tensor * k_cur, ggml_tensor * v_cur, ggml_tensor * kq_b,
                                       ggml_tensor * sinks, ggml_tensor * v_mla, float kq_scale, int il);

// Every tensor the graph names (llm_graph_context::cb): with a calibrated key
// scorer, each layer's "attn_norm" (its normed input) is kept for that layer's
// fastgen op; else nothing.
void llama_fastgen_note_tensor(const llm_graph_context & g, ggml_tensor * cur, const char * name, int il);

// The same two for a model with sliding-window layers (build_attn_inp_kv_iswa,
// build_attn on its input): fastgen runs the global layers, and the
// sliding-window layers run as stock llama.cpp over the SWA cache the fastgen
// memory keeps beside its context.
llm_graph_input_attn_kv_iswa * llama_fastgen_build_inp_iswa(const llm_graph_context & g);
ggml_tensor * llama_fastgen_build_attn_iswa(const llm_graph_context & g, llm_graph_input_attn_kv_iswa * inp,
                                            ggml_tensor * wo, ggml_tensor * wo_b, ggml_tensor * wo_s,
                                            ggml_tensor * q_cur, ggml_tensor * k_cur, ggml_tensor * v_cur,
                                            ggml_tensor * kq_b, ggml_tensor * sinks, ggml_tensor * v_mla,
                                            float kq_scale, int il);
