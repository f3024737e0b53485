/* cinn's thread pool for the parallel loops of its CPU kernels (built and loaded by cinn/runtime/thread_pool.py).
 *
 * TVM's own pool gives each thread one fixed share of a parallel loop and waits for every share: where a core is taken
 * now and then by another process (a busy host, a VM whose virtual CPU is descheduled), each kernel waits for the
 * share of the stalled thread. Here a loop is cut into TASKS_PER_THREAD tasks per thread. Each thread first runs its
 * own tasks in order (the same contiguous share TVM's pool would give it, so a kernel reads what the previous one wrote
 * into the same core's cache), then takes the tasks the others have not started, from the back of their shares.
 *
 * A kernel library's LLVM code calls its parallel loops through its __TVMBackendParallelLaunch pointer, which
 * cinn/runtime/thread_pool.py points at cinn_pool_launch: the lambda, its closure and a task count (0: the pool's choice),
 * with TVM's C ABI (tvm/runtime/c_backend_api.h). One launch runs at a time; a launch from a second thread meanwhile,
 * or from inside a task, runs its tasks on the calling thread.
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

#define MAX_THREADS 256
#ifndef TASKS_PER_THREAD
/* One: a thread's whole share, taken over by another thread when it has not started it. Finer tasks (2, 4 or 8 per
 * thread, contiguous or strided) ran shufflenet's small kernels 1.05-1.11x slower on a quiet machine, and gained at
 * most a few percent more beside a busy process. */
#define TASKS_PER_THREAD 1
#endif
#define SPIN_NS 4000000 /* an idle worker spins this long before it sleeps: a run's gaps between kernels are shorter */
#ifndef PAUSES
/* Then each spin yields: a spinning thread that shares a core with the one it waits for (the scheduler may put both on
 * one core while other processes keep the other busy) would otherwise hold that core for a whole time slice. 400
 * pauses (about 10 us here) keep the quick hand-overs of a quiet machine (64: mobilenet_v2 and shufflenet about 1%
 * slower than TVM's pool, 400: even) and most of the gain beside a busy process. */
#define PAUSES 400
#endif

typedef struct {
  void* sync_handle;
  int32_t num_task;
} TVMParallelGroupEnv;
typedef int (*FLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);

/* tvm-ffi's error API: a task's error, raised on a worker, is raised again on the launching thread. Weak: the pool
 * also loads where libtvm_ffi is not loaded globally (its errors are then lost, the failure is not). */
extern void TVMFFIErrorMoveFromRaised(void** result) __attribute__((weak));
extern void TVMFFIErrorSetRaised(void* error) __attribute__((weak));
extern int TVMFFIObjectDecRef(void* obj) __attribute__((weak));

/* Thread p's share of the current launch: generation << 32 | first << 16 | end (task ids below 65536). A task is taken
 * by a compare-and-swap that also checks the generation, so a worker late from an earlier launch takes nothing. */
struct share {
  _Atomic uint64_t tasks;
  char apart[56]; /* one cache line each: a thread taking its own tasks does not disturb the others' */
};
static _Alignas(64) struct share shares[MAX_THREADS];
static _Atomic uint32_t generation; /* also the futex word sleeping workers wait on */
static _Atomic int active;          /* threads taking part in the current launch */
static _Alignas(64) _Atomic int done; /* tasks run, added once per thread and launch */
static _Atomic int failed, sleepers;
static _Atomic(FLambda) lambda;
static _Atomic(void*) closure;
static void* error; /* the first failed task's error (worker side) */
static TVMParallelGroupEnv env;
static pthread_mutex_t launch_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t spawn_lock = PTHREAD_MUTEX_INITIALIZER;
static int workers; /* worker threads started (the launching thread is participant 0) */
static _Thread_local int threads; /* participants of this thread's launches; 0: not set, default_threads */
static _Atomic int default_threads = 1;
static _Thread_local int in_task;

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void relax(int spins) {
  if (spins < PAUSES)
    CPU_RELAX();
  else
    sched_yield();
}

static uint64_t pack(uint32_t gen, uint32_t first, uint32_t end) {
  return (uint64_t)gen << 32 | (uint64_t)first << 16 | end;
}

/* A task of generation gen from share q (its front when q is the caller's own share, else its back), or -1. */
static int take(int q, uint32_t gen, int front) {
  uint64_t s = atomic_load_explicit(&shares[q].tasks, memory_order_acquire);
  for (;;) {
    uint32_t first = (s >> 16) & 0xffff, end = s & 0xffff;
    if ((uint32_t)(s >> 32) != gen || first >= end) return -1;
    uint64_t rest = front ? pack(gen, first + 1, end) : pack(gen, first, end - 1);
    if (atomic_compare_exchange_weak(&shares[q].tasks, &s, rest)) return front ? (int)first : (int)end - 1;
  }
}

static void run_task(FLambda f, void* cdata, int task, int on_worker) {
  in_task = 1;
  if (f(task, &env, cdata) != 0) {
    int expected = 0;
    if (atomic_compare_exchange_strong(&failed, &expected, 1) && on_worker && TVMFFIErrorMoveFromRaised)
      TVMFFIErrorMoveFromRaised(&error);
  }
  in_task = 0;
}

/* Participant p runs its own share, then what is left of the others'. */
static void run_tasks(int p, int n_active, uint32_t gen) {
  FLambda f = atomic_load_explicit(&lambda, memory_order_relaxed);
  void* cdata = atomic_load_explicit(&closure, memory_order_relaxed);
  int ran = 0;
  for (int k = 0; k < n_active; ++k) {
    int q = (p + k) % n_active, task;
    for (; (task = take(q, gen, k == 0)) >= 0; ++ran) run_task(f, cdata, task, p != 0);
  }
  if (ran) atomic_fetch_add_explicit(&done, ran, memory_order_release);
}

static void* worker(void* arg) {
  int p = (int)(intptr_t)arg;
  uint32_t seen = atomic_load(&generation);
  for (;;) {
    uint32_t gen;
    int64_t sleep_at = now_ns() + SPIN_NS;
    for (int spins = 1; (gen = atomic_load_explicit(&generation, memory_order_acquire)) == seen; ++spins) {
      relax(spins);
      if (spins % PAUSES || now_ns() < sleep_at) continue;
      atomic_fetch_add(&sleepers, 1); /* then the launcher, which stores the generation before it reads sleepers, */
      if (atomic_load(&generation) == seen) /* sees this sleeper or this worker sees the new generation */
        syscall(SYS_futex, &generation, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
      atomic_fetch_sub(&sleepers, 1);
      sleep_at = now_ns() + SPIN_NS;
      spins = 0;
    }
    seen = gen;
    int n_active = atomic_load_explicit(&active, memory_order_relaxed);
    if (p < n_active) run_tasks(p, n_active, gen);
  }
  return NULL;
}

/* Starts workers until n threads (the caller included) can take part; the number that can. */
static int ensure_workers(int n) {
  pthread_mutex_lock(&spawn_lock);
  for (; workers < n - 1; ++workers) {
    pthread_t t;
    if (pthread_create(&t, NULL, worker, (void*)(intptr_t)(workers + 1)) != 0) break;
    pthread_detach(t);
  }
  int available = workers + 1;
  pthread_mutex_unlock(&spawn_lock);
  return available;
}

static void after_fork_in_child(void) { /* the workers did not survive the fork: start new ones when asked */
  workers = 0;
  atomic_store(&sleepers, 0);
  pthread_mutex_init(&launch_lock, NULL);
  pthread_mutex_init(&spawn_lock, NULL);
}

/* Sizes the calling thread's launches to n threads (itself included), and those of threads that never set theirs;
 * the number it got. */
int cinn_pool_set_threads(int n) {
  if (n < 1) n = 1;
  if (n > MAX_THREADS) n = MAX_THREADS;
  int got = ensure_workers(n);
  threads = got < n ? got : n;
  atomic_store(&default_threads, threads);
  return threads;
}

static int run_here(FLambda f, void* cdata, int n) {
  TVMParallelGroupEnv own = {NULL, n};
  for (int i = 0; i < n; ++i)
    if (f(i, &own, cdata) != 0) return -1;
  return 0;
}

int cinn_pool_launch(FLambda f, void* cdata, int num_task) {
  int n_active = threads ? threads : atomic_load(&default_threads);
  int n = num_task > 0 ? num_task : n_active * TASKS_PER_THREAD;
  if (n_active == 1 || n > 0xffff || in_task || pthread_mutex_trylock(&launch_lock) != 0) return run_here(f, cdata, n);
  if (ensure_workers(n_active) < n_active) n_active = workers + 1; /* after a fork */
  uint32_t gen = atomic_load(&generation) + 1;
  env.num_task = n;
  atomic_store_explicit(&lambda, f, memory_order_relaxed);
  atomic_store_explicit(&closure, cdata, memory_order_relaxed);
  atomic_store_explicit(&active, n_active, memory_order_relaxed);
  atomic_store(&done, 0);
  atomic_store(&failed, 0);
  error = NULL;
  for (int q = 0; q < n_active; ++q)
    atomic_store_explicit(&shares[q].tasks, pack(gen, (uint32_t)(q * n / n_active), (uint32_t)((q + 1) * n / n_active)),
                          memory_order_relaxed);
  atomic_store(&generation, gen); /* sequentially consistent: ordered before the load of sleepers */
  if (atomic_load(&sleepers) > 0) syscall(SYS_futex, &generation, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
  run_tasks(0, n_active, gen);
  for (int spins = 0; atomic_load_explicit(&done, memory_order_acquire) < n; ++spins) relax(spins);
  int rc = atomic_load(&failed) ? -1 : 0;
  if (error && TVMFFIErrorSetRaised) {
    TVMFFIErrorSetRaised(error);
    TVMFFIObjectDecRef(error);
  }
  pthread_mutex_unlock(&launch_lock);
  return rc;
}

__attribute__((constructor)) static void install_fork_handler(void) {
  pthread_atfork(NULL, NULL, after_fork_in_child);
}
