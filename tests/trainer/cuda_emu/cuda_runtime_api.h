/* cuda_emu (cuda_runtime.h): the runtime's C API, emulated on the host. */
#include "cuda_runtime.h"
