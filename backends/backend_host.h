/* What the backends whose memory is host memory share: buffers, and the
 * plain read of a head's slot metadata. */
#ifndef FG_BACKEND_HOST_H
#define FG_BACKEND_HOST_H

#include "backends/backend.h"

fg_buffer_alloc_fn fg_host_buffer_alloc;
fg_buffer_free_fn fg_host_buffer_free;
fg_read_slots_fn fg_host_read_slots;

#endif
