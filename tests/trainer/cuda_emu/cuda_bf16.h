/*
 * cuda_emu (cuda_runtime.h): bf16 on the host, converted by the project's bf16conv.h (round to
 * nearest even, NaNs quietened), as CUDA's __float2bfloat16_rn and __bfloat162float do.
 */
#ifndef DDP_CUDA_EMU_BF16_H
#define DDP_CUDA_EMU_BF16_H

#include "bf16conv.h"

typedef struct __nv_bfloat16 {
    uint16_t x;
} __nv_bfloat16;

static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    __nv_bfloat16 b = {bf16_from_f32(f)};
    return b;
}

static inline float __bfloat162float(__nv_bfloat16 b)
{
    return bf16_to_f32(b.x);
}

#endif /* DDP_CUDA_EMU_BF16_H */
