/* SPDX-License-Identifier: MIT */
#ifndef GRAVAC_C_H
#define GRAVAC_C_H
/*! \file gravac_c.h
 *  \brief gravac's stable C ABI: a trainer chosen by names and options, stepped over a
 *  flat float32 gradient buffer, communicating through one of gravac's engines or through
 *  collectives the caller provides as callbacks.
 *
 *  Rules of the boundary:
 *  - Every function returns a gravac_status (GRAVAC_OK is 0); on failure,
 *    gravac_last_error() holds a message for the calling thread. No C++ exception and no
 *    abort crosses the boundary.
 *  - Handles are opaque; structs are plain, and the ones the caller fills begin with
 *    `struct_size` (set it to sizeof the struct) so that later versions can grow them.
 *  - Every exported symbol carries the version node GRAVAC_C_1 (libgravac_c.so.1).
 *  - One library serves every language: Python reaches it through ctypes and links no
 *    framework (docs/c_abi.md).
 *
 *  Compiles as C11 and as C++.
 */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define GRAVAC_C_API __attribute__((visibility("default")))
#else
#define GRAVAC_C_API
#endif

/*! The ABI's version: bumped when a struct or a function changes incompatibly. */
#define GRAVAC_C_ABI_VERSION 1

/*! What a call returned. */
typedef enum gravac_status {
  GRAVAC_OK = 0,                /*!< success */
  GRAVAC_INVALID_ARGUMENT = 1,  /*!< a name, option or argument is out of its domain */
  GRAVAC_MALFORMED_PACKET = 2,  /*!< a packet from a peer failed validation */
  GRAVAC_LAYOUT_MISMATCH = 3,   /*!< ranks (or saved state) disagree on the model or method */
  GRAVAC_NON_FINITE = 4,        /*!< a gradient held NaN or infinity */
  GRAVAC_BACKEND_FAILURE = 5,   /*!< a collective (or a callback), CUDA or the OS failed */
  GRAVAC_TIMEOUT = 6,           /*!< a collective did not complete in time */
  GRAVAC_ABORTED = 7,           /*!< another rank failed */
  GRAVAC_IO_FAILURE = 8,        /*!< state could not be read or written */
  GRAVAC_DIVERGED = 9,          /*!< ranks took different decisions */
  GRAVAC_BUFFER_TOO_SMALL = 10, /*!< an output buffer is too small: the size needed was written */
  GRAVAC_UNSUPPORTED = 11,      /*!< this build cannot do it (e.g. CUDA memory without the CUDA path) */
  GRAVAC_INTERNAL = 12          /*!< anything else (a bug: please report it) */
} gravac_status;

/*! Where a buffer lives. */
typedef enum gravac_device { GRAVAC_DEVICE_HOST = 0, GRAVAC_DEVICE_CUDA = 1 } gravac_device;

/*! Element types a callback reduces. */
typedef enum gravac_dtype { GRAVAC_FLOAT32 = 0, GRAVAC_FLOAT64 = 1 } gravac_dtype;

/*! Reductions a callback performs. */
typedef enum gravac_reduce_op { GRAVAC_SUM = 0, GRAVAC_MAX = 1 } gravac_reduce_op;

/*! What a layer is (chooses AdaComp's bin length and PowerSGD's reshaping). */
typedef enum gravac_layer_kind {
  GRAVAC_LAYER_CONV = 0,
  GRAVAC_LAYER_DENSE = 1,
  GRAVAC_LAYER_RECURRENT = 2,
  GRAVAC_LAYER_BIAS_OR_NORM = 3
} gravac_layer_kind;

/* --- versions and errors ----------------------------------------------------------- */

/*! GRAVAC_C_ABI_VERSION of the loaded library (compare it with the header's). */
GRAVAC_C_API int gravac_abi_version(void);
/*! The library's version, "major.minor.patch". */
GRAVAC_C_API const char* gravac_version(void);
/*! The message of the last failed call on this thread ("" if none); valid until the next
 *  call on this thread. */
GRAVAC_C_API const char* gravac_last_error(void);
/*! A short name of \p s ("invalid argument"). */
GRAVAC_C_API const char* gravac_status_name(gravac_status s);

/* --- names, options and compositions ------------------------------------------------ */

/*! Which list gravac_name_at reads. */
typedef enum gravac_name_list {
  GRAVAC_COMPRESSORS = 0,
  GRAVAC_COLLECTIVES = 1,
  GRAVAC_POLICIES = 2,
  GRAVAC_PRESETS = 3
} gravac_name_list;

/*! Entry \p index of \p list in \p *name (a static string); GRAVAC_INVALID_ARGUMENT past
 *  the end. */
GRAVAC_C_API gravac_status gravac_name_at(gravac_name_list list, size_t index, const char** name);

/*! The type of an option's value. */
typedef enum gravac_option_type {
  GRAVAC_OPTION_BOOL = 0,
  GRAVAC_OPTION_INT = 1,
  GRAVAC_OPTION_REAL = 2,
  GRAVAC_OPTION_CHOICE = 3
} gravac_option_type;

/*! One entry of the option table (static strings). */
typedef struct gravac_option_info {
  const char* name;          /*!< "kept_fraction" */
  gravac_option_type type;   /*!< its type */
  double min, max;           /*!< range of INT and REAL options (inclusive) */
  const char* choices;       /*!< CHOICE: the values, comma-separated; else "" */
  const char* default_value; /*!< the default, as text */
  const char* doc;           /*!< one line */
} gravac_option_info;

/*! Entries in the option table. */
GRAVAC_C_API size_t gravac_option_count(void);
/*! Entry \p index of the option table. */
GRAVAC_C_API gravac_status gravac_option_at(size_t index, gravac_option_info* info);

/*! A method: three names (or a preset) and options as text. */
typedef struct gravac_method {
  uint32_t struct_size;             /*!< sizeof(gravac_method) */
  const char* preset;               /*!< NULL, or a preset ("recommended") the fields below refine */
  const char* compressor;           /*!< NULL: the preset's (or the default "topk") */
  const char* collective;           /*!< NULL: the preset's (or "allgather") */
  const char* policy;               /*!< NULL: the preset's (or "gravac") */
  uint64_t seed;                    /*!< shared seed of random choices */
  double bucket_mb;                 /*!< the trainer's bucket size in MiB (0: one per layer; < 0: default 25) */
  const char* const* option_names;  /*!< option_count names of the option table */
  const char* const* option_values; /*!< their values, as text ("0.01", "true", "bf16") */
  size_t option_count;              /*!< entries in option_names and option_values */
  /* Since the CUDA path (still ABI 1: older callers' struct_size ends before these fields,
   * which then read as GRAVAC_DEVICE_HOST and NULL). */
  gravac_device device; /*!< where the trainer's gradients live: GRAVAC_DEVICE_CUDA compresses on the device */
  void* stream; /*!< GRAVAC_DEVICE_CUDA: the cudaStream_t the device compressors run on; NULL with host memory */
} gravac_method;

/*! Checks \p method without building anything: GRAVAC_OK for a composition the library
 *  accepts with valid options, else GRAVAC_INVALID_ARGUMENT with the reason in
 *  gravac_last_error(). */
GRAVAC_C_API gravac_status gravac_method_check(const gravac_method* method);

/* --- communicators ------------------------------------------------------------------ */

/*! A communicator: one of gravac's engines, or the caller's callbacks. */
typedef struct gravac_comm gravac_comm;

/*! Collectives provided by the caller. Each returns 0 on success, anything else on failure
 *  (the trainer then fails with GRAVAC_BACKEND_FAILURE). Every rank calls them in the same
 *  order; a call returns when the collective is complete, with its result in host memory
 *  for host buffers. The callbacks are called from the thread that steps the trainer, or
 *  from its communication thread during an overlapped step (begin_step .. finish), one at
 *  a time. Buffers are host memory. */
typedef struct gravac_comm_callbacks {
  uint32_t struct_size; /*!< sizeof(gravac_comm_callbacks) */
  void* user;           /*!< passed to every callback */
  int rank;             /*!< this rank */
  int size;             /*!< ranks */
  /*! Reduces \p count elements of \p dtype in place over the ranks. */
  int (*allreduce)(void* user, void* data, size_t count, gravac_dtype dtype, gravac_reduce_op op);
  /*! Gathers \p bytes from every rank into \p recv (size * bytes, rank order). */
  int (*allgather)(void* user, const void* send, size_t bytes, void* recv);
  /*! Broadcasts \p bytes of \p data from \p root. */
  int (*broadcast)(void* user, void* data, size_t bytes, int root);
  /*! Waits for every rank. */
  int (*barrier)(void* user);
  /*! Optional (NULL: collectives that need it, compressed_allreduce, are refused at
   *  construction). Sends send_bytes[j] bytes (blocks back to back in rank order) to rank
   *  j; receives recv_bytes[i] bytes from rank i into \p recv, back to back. */
  int (*alltoallv)(void* user, const void* send, const size_t* send_bytes, void* recv, const size_t* recv_bytes);
} gravac_comm_callbacks;

/*! A communicator over \p callbacks (copied; `user` must outlive the communicator). */
GRAVAC_C_API gravac_status gravac_comm_from_callbacks(const gravac_comm_callbacks* callbacks, gravac_comm** comm);

/*! Collectives over CUDA device memory provided by the caller (e.g. NCCL, or a framework's
 *  process group on the GPU). Every pointer a callback receives is device memory (gravac
 *  stages host values through the device). \p stream is the cudaStream_t to order on: the
 *  callback enqueues the collective on \p stream, after the work queued on it so far (gravac
 *  has ordered that stream after the producer of the inputs); the callback may complete the
 *  collective before it returns, or leave it queued on \p stream: gravac waits for
 *  \p stream after the callback returns and before it reads the result, so each operation
 *  of the communicator is complete when it returns. Each returns 0 on success, anything
 *  else on failure (GRAVAC_BACKEND_FAILURE). Every rank calls them in the same order, from
 *  the thread that steps the trainer or from its communication thread, one at a time.
 *  There is no alltoallv: the compressed_allreduce collective is refused over them. */
typedef struct gravac_device_comm_callbacks {
  uint32_t struct_size; /*!< sizeof(gravac_device_comm_callbacks) */
  void* user;           /*!< passed to every callback */
  int rank;             /*!< this rank */
  int size;             /*!< ranks */
  /*! Reduces \p count elements of \p dtype at \p data (device memory) in place over the ranks. */
  int (*allreduce)(void* user, void* data, size_t count, gravac_dtype dtype, gravac_reduce_op op, void* stream);
  /*! Gathers \p bytes at \p send from every rank into \p recv (size * bytes, rank order; device memory). */
  int (*allgather)(void* user, const void* send, size_t bytes, void* recv, void* stream);
  /*! Broadcasts \p bytes of \p data (device memory) from \p root. */
  int (*broadcast)(void* user, void* data, size_t bytes, int root, void* stream);
  /*! Waits for every rank (in the order of \p stream). */
  int (*barrier)(void* user, void* stream);
} gravac_device_comm_callbacks;

/*! A device communicator over \p callbacks (copied; `user` must outlive it), for trainers
 *  of GRAVAC_DEVICE_CUDA methods. GRAVAC_UNSUPPORTED in a build without the CUDA path. */
GRAVAC_C_API gravac_status gravac_comm_from_device_callbacks(const gravac_device_comm_callbacks* callbacks,
                                                             gravac_comm** comm);

/*! gravac's thread engine: \p size ranks in this process, one thread each. */
typedef struct gravac_thread_world gravac_thread_world;
/*! Creates a world of \p size in-process ranks. */
GRAVAC_C_API gravac_status gravac_thread_world_create(int size, gravac_thread_world** world);
/*! Rank \p rank's communicator of \p world (which must outlive it). */
GRAVAC_C_API gravac_status gravac_comm_from_thread_world(gravac_thread_world* world, int rank, gravac_comm** comm);
/*! Destroys a world (after its communicators). NULL is ignored. */
GRAVAC_C_API void gravac_thread_world_destroy(gravac_thread_world* world);

/*! Destroys a communicator (after the trainers built on it). NULL is ignored. */
GRAVAC_C_API void gravac_comm_destroy(gravac_comm* comm);

/* --- the trainer -------------------------------------------------------------------- */

/*! One tensor of the model, in the flat buffer's order. */
typedef struct gravac_layer {
  const char* name;       /*!< unique; the stable id of its residual */
  const size_t* shape;    /*!< ndim extents (ndim 0: a scalar) */
  size_t ndim;            /*!< dimensions */
  gravac_layer_kind kind; /*!< what it is */
} gravac_layer;

/*! A trainer: compressor, collective and policy, its residuals and policy state. */
typedef struct gravac_trainer gravac_trainer;

/*! Builds a trainer of \p method for \p layers over \p comm (which must outlive it).
 *  Collective: every rank calls it with the same method and layers, and it fails with
 *  GRAVAC_LAYOUT_MISMATCH on every rank when they differ. */
GRAVAC_C_API gravac_status gravac_trainer_create(const gravac_method* method, const gravac_layer* layers,
                                                 size_t layer_count, gravac_comm* comm, gravac_trainer** trainer);
/*! Destroys a trainer. NULL is ignored. */
GRAVAC_C_API void gravac_trainer_destroy(gravac_trainer* trainer);
/*! Elements of the flat gradient buffer. */
GRAVAC_C_API gravac_status gravac_trainer_numel(const gravac_trainer* trainer, size_t* numel);

/*! What one step did. */
typedef struct gravac_step_report {
  uint32_t struct_size;         /*!< sizeof(gravac_step_report), set by the caller */
  uint64_t step;                /*!< the step this reports */
  uint64_t bytes_sent;          /*!< bytes this rank put on the wire (payload) */
  uint64_t dense_bytes;         /*!< bytes a dense fp32 Allreduce would have sent */
  double wire_bytes_sent;       /*!< bytes sent by the collective's algorithm */
  double wire_bytes_received;   /*!< bytes received by the collective's algorithm */
  double gain;                  /*!< ||C(u)|| / ||u|| of what was sent */
  double mean_kept_fraction;    /*!< mean over layers of values sent / numel */
  const char* collective;       /*!< the aggregation used (static string) */
  const char* fallback;         /*!< why the policy sent less compressed, or "none" */
  double compress_s;            /*!< seconds compressing */
  double communicate_s;         /*!< seconds in collectives */
  double decompress_s;          /*!< seconds decompressing and averaging */
  double exposed_communicate_s; /*!< seconds the caller waited for communication */
  uint64_t buckets;             /*!< buckets of the step */
  int skipped;                  /*!< the step was skipped (non-finite gradient, skip mode) */
} gravac_step_report;

/*! One synchronous step: \p grads (numel float32 in \p device memory) is compressed,
 *  aggregated and left holding the rank average. \p device must be the trainer's
 *  (gravac_method::device). \p stream: the CUDA stream the caller's work on \p grads is
 *  ordered on (cudaStream_t; NULL with host memory): the step starts after the work queued
 *  on it so far, and work queued on it after the call sees the average. It may differ from
 *  the trainer's stream (gravac_method::stream), which is then ordered after it and before
 *  it by events. \p report may be NULL. */
GRAVAC_C_API gravac_status gravac_trainer_step(gravac_trainer* trainer, float* grads, size_t numel,
                                               gravac_device device, void* stream, gravac_step_report* report);
/*! Starts an overlapped step on \p grads, which the caller is about to fill layer by layer
 *  (device memory: on \p stream; each gravac_trainer_ready then covers the work queued on
 *  \p stream so far, and gravac_trainer_finish orders \p stream after the step). */
GRAVAC_C_API gravac_status gravac_trainer_begin_step(gravac_trainer* trainer, float* grads, size_t numel,
                                                     gravac_device device, void* stream);
/*! Layer \p layer of the step in progress is final. */
GRAVAC_C_API gravac_status gravac_trainer_ready(gravac_trainer* trainer, size_t layer);
/*! Ends the overlapped step: the buffer holds the rank average. \p report may be NULL. */
GRAVAC_C_API gravac_status gravac_trainer_finish(gravac_trainer* trainer, gravac_step_report* report);
/*! The last step's kept fraction of each layer into \p out (\p count: the layer count). */
GRAVAC_C_API gravac_status gravac_trainer_kept_fractions(const gravac_trainer* trainer, double* out, size_t count);
/*! The end of an interval (an epoch) for the policy. */
GRAVAC_C_API gravac_status gravac_trainer_end_interval(gravac_trainer* trainer, uint64_t epoch, double learning_rate,
                                                       double samples);
/*! A short description of the policy's state into \p out (\p capacity bytes, NUL included);
 *  \p *length: its length. GRAVAC_BUFFER_TOO_SMALL when it does not fit. */
GRAVAC_C_API gravac_status gravac_trainer_policy_state(const gravac_trainer* trainer, char* out, size_t capacity,
                                                       size_t* length);

/*! Saves this rank's residuals, policy, compressor and collective state and step counter
 *  (rank-local, no collective) into \p out. Two-phase: with \p out NULL or \p capacity too
 *  small, writes the size needed to \p *size and returns GRAVAC_BUFFER_TOO_SMALL (GRAVAC_OK
 *  for NULL). */
GRAVAC_C_API gravac_status gravac_trainer_save(const gravac_trainer* trainer, void* out, size_t capacity, size_t* size);
/*! Restores what gravac_trainer_save wrote on the same rank for the same layout and
 *  method; the trainer is unchanged when it fails. */
GRAVAC_C_API gravac_status gravac_trainer_load(gravac_trainer* trainer, const void* data, size_t size);

/* --- local steps (local SGD, DiLoCo and its family) ---------------------------------- */

/*! Local-step training: every rank takes H inner optimizer steps alone, then the ranks
 *  exchange how far their parameters moved (the pseudo-gradient) through the method's
 *  compressor and collective, with error feedback, and an outer optimizer moves the global
 *  parameters (options `local_period`, `local_adaptive`, `outer`, `outer_lr`,
 *  `outer_momentum`, `local_overlap`; docs/local_steps.md). Host memory only. */
typedef struct gravac_local_steps gravac_local_steps;

/*! Where local steps stand. */
typedef struct gravac_local_steps_info {
  uint32_t struct_size;   /*!< sizeof(gravac_local_steps_info), set by the caller */
  uint64_t period;        /*!< H of the round in progress */
  uint64_t round_step;    /*!< inner steps taken in the round in progress */
  uint64_t inner_steps;   /*!< inner steps taken in all */
  uint64_t exchanges;     /*!< exchanges completed (a per-step round is one) */
  int exchange_in_flight; /*!< 1 while an overlapped exchange runs in the background */
} gravac_local_steps_info;

/*! Creates local steps for \p method (policy `fixed`; its compressor and collective run the
 *  exchanges) over the layers, starting from \p params (\p numel floats, the same on every
 *  rank). Collective: every rank calls it with the same method, layers and parameters, and
 *  all fail together when one differs. */
GRAVAC_C_API gravac_status gravac_local_steps_create(const gravac_method* method, const gravac_layer* layers,
                                                     size_t layer_count, gravac_comm* comm, const float* params,
                                                     size_t numel, gravac_local_steps** local);
/*! Destroys \p local (NULL is ignored). An exchange still in flight is abandoned: call
 *  gravac_local_steps_complete_exchange after the last inner step. */
GRAVAC_C_API void gravac_local_steps_destroy(gravac_local_steps* local);
/*! After backward, before the inner optimizer's step. In a per-step round (H = 1) the
 *  gradients become the rank average and \p *averaged is 1; in a round of local steps they
 *  stay this rank's and \p *averaged is 0. \p averaged and \p report may be NULL; the report
 *  is filled when an exchange ran. */
GRAVAC_C_API gravac_status gravac_local_steps_before(gravac_local_steps* local, float* grads, size_t numel,
                                                     int* averaged, gravac_step_report* report);
/*! After the inner optimizer's step on \p params. At the end of a round the exchange and the
 *  outer step run and \p params becomes the point every rank continues from (\p *exchanged
 *  is 1 when an exchange completed, and \p report, if not NULL, is its report). */
GRAVAC_C_API gravac_status gravac_local_steps_after(gravac_local_steps* local, float* params, size_t numel,
                                                    int* exchanged, gravac_step_report* report);
/*! Ends the round in progress now, before its H steps (collective: every rank at the same
 *  inner step): the ranks exchange their progress, the outer step runs and \p params
 *  becomes the global point, the same on every rank; for the end of training, or before
 *  evaluating or saving the model. \p *exchanged is 1 when an exchange completed (0: the
 *  ranks already agreed); \p exchanged and \p report may be NULL. */
GRAVAC_C_API gravac_status gravac_local_steps_finish_round(gravac_local_steps* local, float* params, size_t numel,
                                                           int* exchanged, gravac_step_report* report);
/*! Completes an overlapped exchange in flight (collective: every rank at the same inner step). */
GRAVAC_C_API gravac_status gravac_local_steps_complete_exchange(gravac_local_steps* local);
/*! \p *must_agree is 1 when the call that just ended a round of local steps
 *  (gravac_local_steps_after or gravac_local_steps_finish_round) began per-step rounds
 *  (H = 1), 0 otherwise. After local steps each rank's inner optimizer state (its momentum)
 *  is its own; per-step rounds apply every rank's optimizer to the same averaged gradient, so
 *  unless that state is made the same on every rank first (gravac_local_steps_average_inner_state),
 *  the ranks' parameters drift apart. 1 until the next gravac_local_steps_before;
 *  gravac_local_steps_save keeps it, so a state saved before acting on it resumes with it. */
GRAVAC_C_API gravac_status gravac_local_steps_inner_state_must_agree(const gravac_local_steps* local, int* must_agree);
/*! Replaces \p state (\p n floats of the inner optimizer's state, e.g. its momentum buffers;
 *  host memory, any length) with its average over the ranks, the same bits on every rank: one
 *  allreduce through the exchanges' communicator. Collective: every rank calls it at the same
 *  inner step, between inner steps (after gravac_local_steps_after, with no overlapped
 *  exchange in flight), with the same \p n; call it when
 *  gravac_local_steps_inner_state_must_agree says 1. */
GRAVAC_C_API gravac_status gravac_local_steps_average_inner_state(gravac_local_steps* local, float* state, size_t n);
/*! Where the rounds stand. */
GRAVAC_C_API gravac_status gravac_local_steps_get_info(const gravac_local_steps* local, gravac_local_steps_info* info);
/*! The global parameters as of the last exchange (\p numel floats), the same on every rank. */
GRAVAC_C_API gravac_status gravac_local_steps_global_params(const gravac_local_steps* local, float* out, size_t numel);
/*! The end of an interval (an epoch) for the policy. */
GRAVAC_C_API gravac_status gravac_local_steps_end_interval(gravac_local_steps* local, uint64_t epoch,
                                                           double learning_rate, double samples);
/*! A short description of the rounds (H, the kept fraction) into \p out, as
 *  gravac_trainer_policy_state. */
GRAVAC_C_API gravac_status gravac_local_steps_policy_state(const gravac_local_steps* local, char* out, size_t capacity,
                                                           size_t* length);
/*! Saves the state between inner steps (the global point, the round, the outer optimizer,
 *  both residuals, the exchange's trainer), two-phase as gravac_trainer_save. Completes an
 *  exchange in flight first, so every rank calls it at the same inner step. The caller saves
 *  its parameters and inner optimizer. */
GRAVAC_C_API gravac_status gravac_local_steps_save(gravac_local_steps* local, void* out, size_t capacity, size_t* size);
/*! Restores what gravac_local_steps_save wrote on the same rank for the same method and
 *  layout, between inner steps; unchanged when it fails. */
GRAVAC_C_API gravac_status gravac_local_steps_load(gravac_local_steps* local, const void* data, size_t size);

#ifdef __cplusplus
}
#endif
#endif /* GRAVAC_C_H */
