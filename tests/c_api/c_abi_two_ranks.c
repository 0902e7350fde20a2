/* SPDX-License-Identifier: MIT */
/* A C11 program over libgravac_c: 2 ranks as 2 threads, each with a gravac_comm_callbacks
 * table whose collectives are written here in C over shared memory and a pthread barrier
 * (reductions in rank order, as gravac's thread engine does, so the sums are deterministic).
 * Each rank builds a trainer per method, steps it on deterministic per-rank gradients, and
 * writes the averaged gradients (raw float32, every step back to back) and the state after
 * the last step to <out>/<method>_rank<r>.grads and <out>/<method>_rank<r>.state. Then it
 * restores the state saved after STEPS_BEFORE_SAVE steps and redoes the next step, which
 * must give the same bits. Exit status 0 on success; test_c_api compares the files with
 * gravac::trainer over thread_communicator. */
#define _POSIX_C_SOURCE 200809L /* pthread barriers under -std=c11 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gravac_c.h"

#define RANKS 2
#define STEPS 4
#define STEPS_BEFORE_SAVE 2

/* --- collectives over shared memory ------------------------------------------------- */

typedef struct shared {
  pthread_barrier_t barrier;
  const void* data[RANKS];
  const size_t* sizes[RANKS];
} shared;

typedef struct rank_ctx {
  shared* sh;
  int rank;
  int failed;
  const char* out_dir;
} rank_ctx;

static void wait_all(shared* sh) { pthread_barrier_wait(&sh->barrier); }

static int cb_allreduce(void* user, void* data, size_t count, gravac_dtype dtype, gravac_reduce_op op) {
  rank_ctx* c = (rank_ctx*)user;
  const size_t elem = dtype == GRAVAC_FLOAT32 ? sizeof(float) : sizeof(double);
  void* result = malloc(count * elem + 1);
  size_t i;
  int r;
  if (result == NULL) return 1; /* would hang the peer: acceptable in a test */
  c->sh->data[c->rank] = data;
  wait_all(c->sh);
  for (i = 0; i < count; ++i) {
    if (dtype == GRAVAC_FLOAT32) {
      float acc = ((const float*)c->sh->data[0])[i];
      for (r = 1; r < RANKS; ++r) {
        const float x = ((const float*)c->sh->data[r])[i];
        acc = op == GRAVAC_SUM ? acc + x : (x > acc ? x : acc);
      }
      ((float*)result)[i] = acc;
    } else {
      double acc = ((const double*)c->sh->data[0])[i];
      for (r = 1; r < RANKS; ++r) {
        const double x = ((const double*)c->sh->data[r])[i];
        acc = op == GRAVAC_SUM ? acc + x : (x > acc ? x : acc);
      }
      ((double*)result)[i] = acc;
    }
  }
  wait_all(c->sh); /* nobody reads the inputs any more */
  if (count) memcpy(data, result, count * elem);
  free(result);
  return 0;
}

static int cb_allgather(void* user, const void* send, size_t bytes, void* recv) {
  rank_ctx* c = (rank_ctx*)user;
  int r;
  c->sh->data[c->rank] = send;
  wait_all(c->sh);
  for (r = 0; r < RANKS; ++r)
    if (bytes) memcpy((char*)recv + (size_t)r * bytes, c->sh->data[r], bytes);
  wait_all(c->sh);
  return 0;
}

static int cb_broadcast(void* user, void* data, size_t bytes, int root) {
  rank_ctx* c = (rank_ctx*)user;
  c->sh->data[c->rank] = data;
  wait_all(c->sh);
  if (c->rank != root && bytes) memcpy(data, c->sh->data[root], bytes);
  wait_all(c->sh);
  return 0;
}

static int cb_barrier(void* user) {
  wait_all(((rank_ctx*)user)->sh);
  return 0;
}

static int cb_alltoallv(void* user, const void* send, const size_t* send_bytes, void* recv,
                        const size_t* recv_bytes) {
  rank_ctx* c = (rank_ctx*)user;
  size_t at = 0;
  int i, j;
  c->sh->data[c->rank] = send;
  c->sh->sizes[c->rank] = send_bytes;
  wait_all(c->sh);
  for (i = 0; i < RANKS; ++i) {
    size_t offset = 0;
    for (j = 0; j < c->rank; ++j) offset += c->sh->sizes[i][j];
    if (c->sh->sizes[i][c->rank] != recv_bytes[i]) return 2;
    if (recv_bytes[i]) memcpy((char*)recv + at, (const char*)c->sh->data[i] + offset, recv_bytes[i]);
    at += recv_bytes[i];
  }
  wait_all(c->sh);
  return 0;
}

/* --- the model and its gradients ---------------------------------------------------- */

static const size_t conv_shape[] = {8, 3, 3, 3};
static const size_t conv_bias_shape[] = {8};
static const size_t fc_shape[] = {10, 32};
static const size_t fc_bias_shape[] = {10};
static const gravac_layer layers[] = {
    {"conv1.weight", conv_shape, 4, GRAVAC_LAYER_CONV},
    {"conv1.bias", conv_bias_shape, 1, GRAVAC_LAYER_BIAS_OR_NORM},
    {"fc.weight", fc_shape, 2, GRAVAC_LAYER_DENSE},
    {"fc.bias", fc_bias_shape, 1, GRAVAC_LAYER_BIAS_OR_NORM},
    {"scale", NULL, 0, GRAVAC_LAYER_BIAS_OR_NORM}};
#define LAYER_COUNT (sizeof layers / sizeof layers[0])

/* Gradient element i of \p rank at \p step: integer hashing, so C and C++ agree bit for bit
 * (test_c_api.cpp has the same function). */
static float grad_at(size_t i, unsigned step, int rank) {
  uint64_t h = (uint64_t)i * 0x9E3779B97F4A7C15ull ^ ((uint64_t)step << 32) ^ ((uint64_t)rank << 48);
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return (float)((int32_t)(h >> 40) - (1 << 23)) / (float)(1 << 23);
}

/* --- one rank ------------------------------------------------------------------------ */

#define CHECK(call)                                                                                       \
  do {                                                                                                    \
    gravac_status s_ = (call);                                                                            \
    if (s_ != GRAVAC_OK) {                                                                                \
      fprintf(stderr, "rank %d: %s failed: %s (%s)\n", c->rank, #call, gravac_status_name(s_),             \
              gravac_last_error());                                                                       \
      goto fail;                                                                                          \
    }                                                                                                     \
  } while (0)

static int write_file(const char* path, const void* data, size_t bytes) {
  FILE* f = fopen(path, "wb");
  size_t written;
  if (f == NULL) return 0;
  written = fwrite(data, 1, bytes, f);
  return fclose(f) == 0 && written == bytes;
}

static int run_method(rank_ctx* c, gravac_comm* comm, const char* tag, const gravac_method* method) {
  gravac_trainer* trainer = NULL;
  float* grads = NULL;
  float* outputs = NULL;
  unsigned char* saved = NULL;
  unsigned char* final_state = NULL;
  size_t numel = 0, saved_size = 0, final_size = 0, i;
  unsigned step;
  char path[1024];
  int ok = 0;
  gravac_step_report report;

  CHECK(gravac_trainer_create(method, layers, LAYER_COUNT, comm, &trainer));
  CHECK(gravac_trainer_numel(trainer, &numel));
  grads = (float*)malloc(numel * sizeof(float));
  outputs = (float*)malloc(STEPS * numel * sizeof(float));
  if (grads == NULL || outputs == NULL) goto fail;
  for (step = 0; step < STEPS; ++step) {
    if (step == STEPS_BEFORE_SAVE) {
      CHECK(gravac_trainer_save(trainer, NULL, 0, &saved_size));
      saved = (unsigned char*)malloc(saved_size);
      if (saved == NULL) goto fail;
      CHECK(gravac_trainer_save(trainer, saved, saved_size, &saved_size));
    }
    for (i = 0; i < numel; ++i) grads[i] = grad_at(i, step, c->rank);
    memset(&report, 0, sizeof report);
    report.struct_size = sizeof report;
    CHECK(gravac_trainer_step(trainer, grads, numel, GRAVAC_DEVICE_HOST, NULL, &report));
    if (report.step != step) {
      fprintf(stderr, "rank %d: report.step %llu, expected %u\n", c->rank, (unsigned long long)report.step, step);
      goto fail;
    }
    memcpy(outputs + (size_t)step * numel, grads, numel * sizeof(float));
  }
  CHECK(gravac_trainer_save(trainer, NULL, 0, &final_size));
  final_state = (unsigned char*)malloc(final_size);
  if (final_state == NULL) goto fail;
  if (final_size > 0 && gravac_trainer_save(trainer, final_state, final_size - 1, &final_size) != GRAVAC_BUFFER_TOO_SMALL) {
    fprintf(stderr, "rank %d: a too small buffer was not refused\n", c->rank);
    goto fail;
  }
  CHECK(gravac_trainer_save(trainer, final_state, final_size, &final_size));

  snprintf(path, sizeof path, "%s/%s_rank%d.grads", c->out_dir, tag, c->rank);
  if (!write_file(path, outputs, STEPS * numel * sizeof(float))) goto fail;
  snprintf(path, sizeof path, "%s/%s_rank%d.state", c->out_dir, tag, c->rank);
  if (!write_file(path, final_state, final_size)) goto fail;

  /* Save -> load round trip: back to the state after STEPS_BEFORE_SAVE steps, the next step
   * gives the same bits. */
  CHECK(gravac_trainer_load(trainer, saved, saved_size));
  for (i = 0; i < numel; ++i) grads[i] = grad_at(i, STEPS_BEFORE_SAVE, c->rank);
  CHECK(gravac_trainer_step(trainer, grads, numel, GRAVAC_DEVICE_HOST, NULL, NULL));
  if (memcmp(grads, outputs + (size_t)STEPS_BEFORE_SAVE * numel, numel * sizeof(float)) != 0) {
    fprintf(stderr, "rank %d: %s: the step after save -> load differs from the original\n", c->rank, tag);
    goto fail;
  }
  ok = 1;
fail:
  gravac_trainer_destroy(trainer);
  free(grads);
  free(outputs);
  free(saved);
  free(final_state);
  return ok;
}

static void* rank_main(void* arg) {
  rank_ctx* c = (rank_ctx*)arg;
  gravac_comm* comm = NULL;
  gravac_comm_callbacks cb;
  const char* topk_names[] = {"kept_fraction"};
  const char* topk_values[] = {"0.1"};
  gravac_method topk, dense;

  memset(&cb, 0, sizeof cb);
  cb.struct_size = sizeof cb;
  cb.user = c;
  cb.rank = c->rank;
  cb.size = RANKS;
  cb.allreduce = cb_allreduce;
  cb.allgather = cb_allgather;
  cb.broadcast = cb_broadcast;
  cb.barrier = cb_barrier;
  cb.alltoallv = cb_alltoallv;
  CHECK(gravac_comm_from_callbacks(&cb, &comm));

  memset(&topk, 0, sizeof topk);
  topk.struct_size = sizeof topk;
  topk.compressor = "topk";
  topk.collective = "allgather";
  topk.policy = "fixed";
  topk.seed = 42;
  topk.bucket_mb = -1;
  topk.option_names = topk_names;
  topk.option_values = topk_values;
  topk.option_count = 1;
  CHECK(gravac_method_check(&topk));

  memset(&dense, 0, sizeof dense);
  dense.struct_size = sizeof dense;
  dense.preset = "dense";
  dense.seed = 42;
  dense.bucket_mb = -1;

  if (!run_method(c, comm, "topk", &topk)) goto fail;
  if (!run_method(c, comm, "dense", &dense)) goto fail;
  gravac_comm_destroy(comm);
  return NULL;
fail:
  gravac_comm_destroy(comm);
  c->failed = 1;
  return NULL;
}

int main(int argc, char** argv) {
  shared sh;
  rank_ctx ctx[RANKS];
  pthread_t threads[RANKS];
  int r, failed = 0;
  if (argc != 2) {
    fprintf(stderr, "usage: %s <output directory>\n", argv[0]);
    return 2;
  }
  if (gravac_abi_version() != GRAVAC_C_ABI_VERSION) {
    fprintf(stderr, "ABI version %d, header %d\n", gravac_abi_version(), GRAVAC_C_ABI_VERSION);
    return 1;
  }
  memset(&sh, 0, sizeof sh);
  pthread_barrier_init(&sh.barrier, NULL, RANKS);
  for (r = 0; r < RANKS; ++r) {
    ctx[r].sh = &sh;
    ctx[r].rank = r;
    ctx[r].failed = 0;
    ctx[r].out_dir = argv[1];
    pthread_create(&threads[r], NULL, rank_main, &ctx[r]);
  }
  for (r = 0; r < RANKS; ++r) {
    pthread_join(threads[r], NULL);
    failed |= ctx[r].failed;
  }
  pthread_barrier_destroy(&sh.barrier);
  printf("c_abi_two_ranks: %s (gravac %s)\n", failed ? "FAILED" : "ok", gravac_version());
  return failed ? 1 : 0;
}
