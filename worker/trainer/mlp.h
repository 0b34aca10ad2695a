/*
 * mlp: ddp-train's model, a multi-layer perceptron in -> H -> ... -> H -> classes with ReLU
 * after every hidden layer and a softmax cross-entropy loss, forward and backward on OpenBLAS.
 *
 * The model owns only its scratch activations. Parameters and gradients belong to the caller
 * (in ddp-train: libddp's arenas) and are handed over one linear layer at a time through a
 * begin/end hook pair, so that a ZeRO-3 trainer can gather a layer right before it is used and
 * mark its gradients ready right after they are final:
 *
 *   forward:  for l = 0 .. L-1:   begin(l, 0, &io)  compute with io.W, io.b   end(l, 0)
 *   backward: for l = L-1 .. 0:   begin(l, 1, &io)  io.dW += ..., io.db += ... end(l, 1)
 *
 * Layout (torch.nn.Linear's): layer l has W (out_l, in_l) row-major and b (out_l). Gradients
 * are added (+=) into io.dW and io.db, never overwritten: micro-steps accumulate, and the owner
 * of the buffers zeroes them (libddp does when it hands them out).
 *
 * The loss is loss_scale * sum over the batch of -log softmax(logits)[label]. With loss_scale =
 * world / global_batch on every micro-batch of every rank (libddp averages over the ranks), the
 * accumulated and averaged gradients are those of the mean loss over the global batch, whatever
 * the split.
 *
 * Mixed precision (cfg.bf16 = 1), the CUDA path's (mlp_cuda.h) emulated on the host: the
 * parameters come as bf16 (io.W16, io.b16) and are widened to f32 for sgemm; the inputs, the
 * hidden activations (after ReLU) and the gradients that enter a matrix product (dlogits, and
 * each hidden layer's after ReLU's mask) are rounded to bf16; products, bias additions,
 * softmax, the loss and the parameter gradients stay f32. So both paths round the same values
 * at the same places, and the host runs the bf16 accuracy tests that the device cannot run
 * without a GPU.
 *
 * Conventions: functions that can fail return 0 or a negative errno (-EINVAL, -ENOMEM) or the
 * hook's own negative code. A model is used by one thread at a time.
 */
#ifndef DDP_TRAIN_MLP_H
#define DDP_TRAIN_MLP_H

#include <stddef.h>
#include <stdint.h>

typedef struct mlp_config {
    int in_dim;  /* input features (784 for Fashion-MNIST); > 0 */
    int hidden;  /* H, the width of every hidden layer; > 0 */
    int layers;  /* hidden layers; >= 1 */
    int classes; /* outputs (10); >= 2 */
    int bf16;    /* 0: f32 throughout; 1: bf16 parameters and activations (see above) */
} mlp_config;

/* The number of linear layers: layers + 1. */
int mlp_num_linear(const mlp_config *c);
/* Input and output width of linear layer l (0 <= l < mlp_num_linear()). */
int mlp_layer_in(const mlp_config *c, int l);
int mlp_layer_out(const mlp_config *c, int l);
/* The number of parameters (weights and biases) of the whole model. */
size_t mlp_num_params(const mlp_config *c);

/*
 * torch.nn.Linear's default initialisation, for one tensor of linear layer with `fan_in` inputs:
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming_uniform_ with a = sqrt(5) for the weight gives
 * exactly this bound, and so does the bias's rule). The draws come from rng.h's generator for
 * (seed, stream); ddp-train uses the parameter's index as the stream.
 */
void mlp_init_uniform(float *data, size_t count, int fan_in, uint64_t seed, uint64_t stream);

typedef struct mlp mlp;

/*
 * Creates a model for batches of up to max_batch rows: validates `cfg` (copied) and allocates
 * the activations once (about 2 * max_batch * (layers * hidden + classes) floats; bf16 adds the
 * rounded inputs and one layer's widened parameters). Returns 0
 * and sets *out, -EINVAL or -ENOMEM.
 */
int mlp_create(const mlp_config *cfg, int max_batch, mlp **out);

/* Frees the model. NULL is a no-op. */
void mlp_free(mlp *m);

/*
 * What a hook hands to one linear layer; shapes (out, in) of that layer. An f32 model reads W
 * and b, a bf16 one W16 and b16 (bf16 bit patterns); gradients are f32 in both. mlp_cuda.h
 * uses the same struct with device pointers.
 */
typedef struct mlp_layer {
    const float *W;     /* (out, in) row-major; needed in forward and backward */
    const float *b;     /* (out); needed in forward */
    const uint16_t *W16; /* cfg.bf16: (out, in) in bf16, instead of W */
    const uint16_t *b16; /* cfg.bf16: (out) in bf16, instead of b */
    float *dW;          /* (out, in); backward adds the gradient here */
    float *db;          /* (out); backward adds the gradient here */
} mlp_layer;

/*
 * The caller's view of the parameters. begin(arg, l, backward, io) fills *io for linear layer l
 * (forward: W and b; backward: W, dW and db) and end(arg, l, backward) says the model is done
 * with it (backward: dW and db are final). A negative return stops the pass, which returns it
 * (end is not called for a layer whose begin failed). The pointers must stay valid from begin
 * to end. end may be NULL.
 */
typedef struct mlp_hooks {
    int (*begin)(void *arg, int layer, int backward, mlp_layer *io);
    int (*end)(void *arg, int layer, int backward);
    void *arg;
} mlp_hooks;

/* What a forward pass measured over its batch. */
typedef struct mlp_stats {
    double loss_sum; /* sum over the batch of the cross-entropy (natural log) */
    int correct;     /* rows whose argmax (first maximum) equals the label */
} mlp_stats;

/*
 * Forward over x (B, in_dim) (borrowed until mlp_backward() returns) with labels y (B) in
 * [0, classes) (borrowed likewise; NULL: logits only, no loss and no backward). B may be 0 (the
 * hooks still run, for ZeRO-3's collective gathers). Fills *stats when given. Returns 0,
 * -EINVAL (B out of [0, max_batch], a label out of range) or a hook's code.
 */
int mlp_forward(mlp *m, const mlp_hooks *h, const float *x, const uint8_t *y, int B,
                mlp_stats *stats);

/*
 * Backward of the latest forward (which had labels), for the loss loss_scale * sum of
 * cross-entropies, layers in reverse order, adding each layer's gradients into its io.dW and
 * io.db. Returns 0, -EINVAL (no forward with labels before) or a hook's code.
 */
int mlp_backward(mlp *m, const mlp_hooks *h, float loss_scale);

/* The latest forward's logits, (B, classes) (softmax probabilities after a forward with labels). */
const float *mlp_output(const mlp *m);

/*
 * OpenBLAS's kernels for this CPU. A DYNAMIC_ARCH OpenBLAS picks its kernels from the CPU model
 * when the library loads, and falls back to its oldest x86-64 set, "Prescott" (SSE3), for a
 * model it does not know: Debian 12's 0.3.21 does so on Emerald Rapids Xeons, where its
 * SkylakeX (AVX-512) kernels run sgemm 4.7 times faster. mlp_blas_core_hint() returns the
 * OpenBLAS core type (OPENBLAS_CORETYPE) that suits this CPU's instruction sets ("SkylakeX",
 * "Haswell" or "Sandybridge", from __builtin_cpu_supports) when the library fell back to
 * Prescott, else NULL (the library's own choice stands). Pure but for reading CPUID.
 *
 * mlp_blas_select(argv): when OPENBLAS_CORETYPE is unset and mlp_blas_core_hint() names a core,
 * sets OPENBLAS_CORETYPE to it and re-executes the program (/proc/self/exe, argv, the same
 * pid), since OpenBLAS reads the variable only when it loads. Call first thing in main(), before
 * any thread starts. Returns only when there is nothing to do (0) or the exec failed (-errno;
 * the program goes on with the library's choice).
 */
const char *mlp_blas_core_hint(void);
int mlp_blas_select(char **argv);

/* OpenBLAS's name for the kernels in use ("SkylakeX", "Haswell", "Prescott", ...). */
const char *mlp_blas_core(void);

#endif /* DDP_TRAIN_MLP_H */
