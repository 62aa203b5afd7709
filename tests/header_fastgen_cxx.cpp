// fastgen.h compiles as C++ (an engine written in C++ includes it as it is),
// its inline _sized wrappers with it, and the experimental declarations when
// asked for.
#define FG_EXPERIMENTAL
#include "fastgen.h"

int main() {
    fg_context_params p;
    fg_context_params_default(&p);
    fg_compression_params cp;
    if (fg_compression_params_preset("fastgen-adaptive", &cp) != FG_OK || fg_compression_params_validate(&cp) != FG_OK)
        return 1;
    char buf[256];
    if (fg_cpu_describe(buf, sizeof buf) != FG_OK)
        return 1;
    const unsigned flags = FG_ADAPTIVE_PER_LAYER;
    return p.page_tokens == 16 && p.v_dtype == -1 && cp.allocation == FG_ALLOC_ADAPTIVE && flags ? 0 : 1;
}
