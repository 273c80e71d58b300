// The probe's timing loop in C, one process per GPU: the reference that tells Python's cost from the cost of
// running one process per GPU (nccl-tests -t N -g 1 runs one thread per GPU, all in one process).
//
//   nccl_mp_ref NGPUS MIN_BYTES MAX_BYTES BUFFER_BYTES ITERS CYCLES
//
// Forks NGPUS processes; process r drives GPU r through a communicator of its own (ncclCommInitRank, default
// config, as the probe's), a non-blocking stream and a cudaMalloc'd buffer (torch's allocator uses cudaMalloc).
// Every size from MIN_BYTES to MAX_BYTES (doubling) is warmed once; then CYCLES cycles over the sizes, each timed
// as the probe (and nccl-tests' BenchTime) does: one all-reduce of the size, waited for (the line-up), the clock,
// ITERS in-place float sum all-reduces back to back (each at the next size-long slot of the buffer), the clock
// (host time), the wait for the stream, the clock. Each rank prints one line per timed run:
//   RANK CYCLE SIZE TIME_US HOST_US
// (per call). Exit 0 when every process exits 0. The parent touches neither CUDA nor NCCL (a CUDA context does
// not survive fork): process 0 makes the NCCL id and hands it to the others through pipes. A failed process, or
// 300 s gone, ends them all (the others would wait in NCCL for ever); so does the parent's end.
#include <cuda_runtime.h>
#include <nccl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int rank = -1;

#define CUDA_OK(cmd)                                                                                      \
  do {                                                                                                    \
    cudaError_t e_ = (cmd);                                                                               \
    if (e_ != cudaSuccess) {                                                                              \
      fprintf(stderr, "rank %d: %s:%d: %s\n", rank, __FILE__, __LINE__, cudaGetErrorString(e_));          \
      exit(1);                                                                                            \
    }                                                                                                     \
  } while (0)
#define NCCL_OK(cmd)                                                                                      \
  do {                                                                                                    \
    ncclResult_t r_ = (cmd);                                                                              \
    if (r_ != ncclSuccess) {                                                                              \
      fprintf(stderr, "rank %d: %s:%d: %s\n", rank, __FILE__, __LINE__, ncclGetErrorString(r_));          \
      exit(1);                                                                                            \
    }                                                                                                     \
  } while (0)

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void full_io(int fd, void* data, size_t n, int writing) {
  char* p = (char*)data;
  while (n > 0) {
    ssize_t k = writing ? write(fd, p, n) : read(fd, p, n);
    if (k <= 0) {
      fprintf(stderr, "rank %d: the NCCL id pipe broke\n", rank);
      exit(1);
    }
    p += k;
    n -= (size_t)k;
  }
}

static int run(int n, int (*pipes)[2], size_t min_bytes, size_t max_bytes, size_t buffer_bytes, int iters,
               int cycles) {
  ncclUniqueId id;
  if (rank == 0) {
    NCCL_OK(ncclGetUniqueId(&id));
    for (int r = 1; r < n; r++) full_io(pipes[r][1], &id, sizeof(id), 1);
  } else {
    full_io(pipes[rank][0], &id, sizeof(id), 0);
  }
  CUDA_OK(cudaSetDevice(rank));
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, n, id, rank));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  char* buf;
  CUDA_OK(cudaMalloc((void**)&buf, buffer_bytes));
  CUDA_OK(cudaMemset(buf, 0, buffer_bytes));
  size_t sizes[64];
  int nsizes = 0;
  for (size_t b = min_bytes; b <= max_bytes && nsizes < 64; b *= 2) sizes[nsizes++] = b;
  for (int k = 0; k < nsizes; k++) NCCL_OK(ncclAllReduce(buf, buf, sizes[k] / 4, ncclFloat, ncclSum, comm, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  for (int c = 0; c < cycles; c++) {
    for (int k = 0; k < nsizes; k++) {
      size_t size = sizes[k], count = size / 4, steps = buffer_bytes / size ? buffer_bytes / size : 1;
      NCCL_OK(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, stream));  // the line-up
      CUDA_OK(cudaStreamSynchronize(stream));
      double t0 = now();
      for (int i = 0; i < iters; i++) {
        char* p = buf + size * ((size_t)i % steps);
        NCCL_OK(ncclAllReduce(p, p, count, ncclFloat, ncclSum, comm, stream));
      }
      double t1 = now();
      CUDA_OK(cudaStreamSynchronize(stream));
      double t2 = now();
      printf("%d %d %zu %.3f %.3f\n", rank, c, size, (t2 - t0) / iters * 1e6, (t1 - t0) / iters * 1e6);
      fflush(stdout);
    }
  }
  NCCL_OK(ncclCommDestroy(comm));
  CUDA_OK(cudaFree(buf));
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 7) {
    fprintf(stderr, "usage: %s NGPUS MIN_BYTES MAX_BYTES BUFFER_BYTES ITERS CYCLES\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[1]), iters = atoi(argv[5]), cycles = atoi(argv[6]);
  size_t min_bytes = strtoull(argv[2], NULL, 10), max_bytes = strtoull(argv[3], NULL, 10);
  size_t buffer_bytes = strtoull(argv[4], NULL, 10);
  if (n < 1 || n > 64 || iters < 1 || cycles < 1 || min_bytes < 4 || buffer_bytes < max_bytes) {
    fprintf(stderr, "nccl_mp_ref: bad arguments\n");
    return 2;
  }
  int pipes[64][2];
  for (int r = 0; r < n; r++) {
    if (pipe(pipes[r]) != 0) {
      perror("pipe");
      return 1;
    }
  }
  pid_t pids[64];
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] < 0) {
      perror("fork");
      return 1;
    }
    if (pids[r] == 0) {
      rank = r;
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // the parent's end (a timeout's kill) ends every rank
      exit(run(n, pipes, min_bytes, max_bytes, buffer_bytes, iters, cycles));
    }
  }
  alarm(300);  // its default action ends the parent, and so the ranks
  int failed = 0;
  for (int left = n; left > 0; left--) {
    int status = 0;
    if (wait(&status) < 0) break;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      failed = 1;
      for (int r = 0; r < n; r++) kill(pids[r], SIGKILL);
    }
  }
  return failed;
}
