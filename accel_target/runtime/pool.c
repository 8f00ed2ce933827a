/* accel's thread pool: TVM's TVMBackendParallelLaunch contract, run so that no kernel waits
 * for a worker that has not started (accel_target/runtime/pool.py installs it).
 *
 * TVM's pool hands task i to worker i and waits until every worker has run its task. A worker
 * that another library's busy thread keeps off its core (numpy's OpenBLAS and PyTorch's OpenMP
 * threads spin for a while after their calls) then delays every kernel by a scheduler quantum.
 * Here tasks are claimed by whichever thread gets to them first: the caller claims and runs
 * tasks too, and at the end waits only for the tasks that a worker is running. A worker that
 * wakes late finds nothing left to do.
 *
 * A launch has one task per thread, as TVM's: the kernels' parallel loops are cut into one
 * chunk per thread (topi_accel), and more, smaller tasks measured slower alone and no faster
 * after other libraries' work (benchmarks/coexistence.py).
 *
 * The job is one 64-bit word, generation << 32 | tasks claimed, from which tasks are claimed by
 * compare-and-swap. A new job first closes the word (a new generation, every task claimed),
 * then writes its fields, then opens the word: a claim that succeeds was made on the current
 * job, so the job's fields read before it are that job's.
 *
 * Between launches a worker spins for ACCEL_POOL_SPIN_US microseconds (default 200), then
 * sleeps on a futex; the launching thread waits for the workers' tasks spinning for
 * JOIN_SPIN_US, then on a futex (a worker that is late has lost its core). Nobody calls
 * sched_yield: Linux's EEVDF scheduler answers it by pushing the yielding thread's deadline a
 * time slice later, so a thread that yields in a loop while another library's thread spins on
 * its core (an OpenMP worker spinning after PyTorch's op does not yield) gets almost none of
 * the core. Instead a worker asks for a short slice (WORKER_SLICE_US), which lets its wakeup
 * take the core from such a spinner at once. The workers' affinity leaves out the launching
 * thread's CPU: the launching thread sets it when it finds itself on another CPU than at its
 * last launch, and a worker that finds itself on the launching thread's CPU all the same sets
 * its own (a worker woken there would preempt the launching thread, which may then wait
 * behind other libraries' spinners for milliseconds; a worker that stayed there took no task).
 * Where the pool has no other CPU a worker there takes no task and naps for COLOCATED_NAP_US.
 * One launch at a time uses the workers: a launch from another thread meanwhile, or from
 * inside a task, runs its kernel as one task on its own thread. Workers are named
 * "accel-pool". The pool has no barrier: a library whose kernels call
 * TVMBackendParallelBarrier stays on TVM's pool (pool.py). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <tvm/runtime/c_backend_api.h> /* TVMParallelGroupEnv, FTVMParallelLambda */
#include <unistd.h>

typedef TVMParallelGroupEnv group_env;
typedef FTVMParallelLambda parallel_lambda;

#define MAX_THREADS 256
#define CLOSED 0x7fffffffu /* tasks claimed, of a job being published: none left */
#define JOIN_SPIN_US 50
#define COLOCATED_NAP_US 500
#define WORKER_SLICE_US 100

#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ volatile("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

/* For tests (tests/runtime/pool_stress.c): a pause where two threads' steps may interleave,
 * to make a rare interleaving common. Nothing here. */
#ifndef ACCEL_POOL_STRETCH
#define ACCEL_POOL_STRETCH() ((void)0)
#endif

static struct {
  int threads; /* the caller and threads - 1 workers; 0 until the first launch */
  int spin_us;
  atomic_int busy; /* a launch holds the workers */
  _Atomic(parallel_lambda) lambda;
  _Atomic(void*) cdata;
  atomic_int num_task;
  _Atomic uint64_t claims; /* generation << 32 | tasks claimed */
  atomic_int done;         /* futex word of the launching thread, once it waits there */
  atomic_int caller_waits; /* the launching thread sleeps on `done` */
  atomic_int caller_cpu;   /* the CPU of the last launching thread, which the workers' affinity leaves out */
  cpu_set_t cpus;          /* where the pool's threads may run: the first launching thread's CPUs */
  pthread_t workers[MAX_THREADS];
  atomic_int failed;
  atomic_uint published; /* futex word: one more per job */
  atomic_int sleeping;   /* workers asleep on `published` */
  unsigned first_published;
  atomic_int held; /* accel_pool_hold */
  /* accel_pool_stats: launches; of them run on the launching thread alone because another
   * launch had the workers; tasks the launching threads ran; tasks the workers ran */
  atomic_long launches, launches_alone, tasks_by_caller, tasks_by_workers;
} pool;

static _Thread_local int in_task; /* the thread runs a task (nested launches run alone) */

static void futex(void* word, int op, unsigned value) { /* word: a 32-bit atomic */
  syscall(SYS_futex, word, op | FUTEX_PRIVATE_FLAG, value, NULL, NULL, 0);
}

static int64_t now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

static void run_task(parallel_lambda f, void* cdata, int task, int num_task, int by_worker) {
  group_env env = {&pool, num_task};
  in_task = 1;
  if (f(task, &env, cdata) != 0) atomic_store(&pool.failed, 1);
  in_task = 0;
  atomic_fetch_add_explicit(by_worker ? &pool.tasks_by_workers : &pool.tasks_by_caller, 1, memory_order_relaxed);
  atomic_fetch_add(&pool.done, 1);
  if (by_worker && atomic_load(&pool.caller_waits)) futex(&pool.done, FUTEX_WAKE, 1);
}

/* Claim and run the current job's unclaimed tasks. */
static void claim_tasks(int by_worker) {
  for (;;) {
    uint64_t word = atomic_load_explicit(&pool.claims, memory_order_acquire);
    ACCEL_POOL_STRETCH();
    parallel_lambda f = atomic_load_explicit(&pool.lambda, memory_order_relaxed);
    void* cdata = atomic_load_explicit(&pool.cdata, memory_order_relaxed);
    int num_task = atomic_load_explicit(&pool.num_task, memory_order_relaxed);
    int task = (int)(uint32_t)word;
    if (task >= num_task) return;
    /* a job published while held is the caller's alone: a worker woken for an earlier job
     * finds it open but leaves it (`held` is set before the job opens) */
    if (by_worker && atomic_load_explicit(&pool.held, memory_order_relaxed)) return;
    atomic_thread_fence(memory_order_acquire); /* fields of a job published since: the claim fails */
    if (atomic_compare_exchange_weak_explicit(&pool.claims, &word, word + 1, memory_order_acq_rel,
                                              memory_order_relaxed))
      run_task(f, cdata, task, num_task, by_worker);
  }
}

/* This thread's CPU if the last launching thread ran there, else -1. */
static int callers_cpu_here(void) {
  int cpu = sched_getcpu(); /* -1 where the kernel cannot tell: then never */
  return cpu >= 0 && cpu == atomic_load_explicit(&pool.caller_cpu, memory_order_relaxed) ? cpu : -1;
}

/* Take `cpu`, the launching thread's, out of the CPUs of worker `thread` (the pool's CPUs but
 * that one): the kernel moves the worker at once if it is there. 0 where the pool has no
 * other CPU. */
static int keep_off(pthread_t thread, int cpu) {
  cpu_set_t others = pool.cpus;
  CPU_CLR(cpu, &others);
  return CPU_COUNT(&others) > 0 && pthread_setaffinity_np(thread, sizeof others, &others) == 0;
}

/* Before the launching thread on `cpu` wakes the workers: keep them all off its CPU. */
static void keep_workers_off(int cpu) {
  for (int i = 1; i < pool.threads; ++i) keep_off(pool.workers[i], cpu);
}

/* Ask the scheduler for a short time slice for this thread (Linux 6.12 and later; earlier
 * kernels ignore it): woken onto a core where another library's thread spins, it runs at once
 * rather than after that thread's slice, and over a longer time it gets no more of the core
 * than before. Its policy and nice value stay as they are. */
static void ask_short_slice(void) {
  struct {
    uint32_t size, policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime, deadline, period;
  } attr = {sizeof attr, (uint32_t)sched_getscheduler(0), 0, getpriority(PRIO_PROCESS, 0), 0, WORKER_SLICE_US * 1000,
            0, 0};
  if (attr.policy == SCHED_OTHER || attr.policy == SCHED_BATCH) syscall(SYS_sched_setattr, 0, &attr, 0);
}

/* Wait for a job published after `seen` and return its number: spin for spin_us, then sleep
 * on the futex. On the launching thread's CPU, leave it; where it cannot, nap instead (the
 * launching thread runs the jobs published meanwhile), again while jobs come, else sleep. */
static unsigned await_job(unsigned seen) {
  int64_t until = now_us() + pool.spin_us;
  for (;;) {
    unsigned published = atomic_load_explicit(&pool.published, memory_order_acquire);
    int shared = callers_cpu_here();
    if (shared >= 0 && keep_off(pthread_self(), shared)) {
      continue;
    } else if (shared >= 0) {
      struct timespec nap = {0, COLOCATED_NAP_US * 1000};
      nanosleep(&nap, NULL);
      seen = atomic_load_explicit(&pool.published, memory_order_acquire);
      if (seen != published) continue;
    } else if (published != seen) {
      return published;
    } else if (now_us() < until) {
      CPU_RELAX();
      continue;
    }
    atomic_fetch_add(&pool.sleeping, 1);
    while (atomic_load(&pool.published) == seen) futex(&pool.published, FUTEX_WAIT, seen);
    atomic_fetch_sub(&pool.sleeping, 1);
    until = now_us() + pool.spin_us;
  }
}

static void* worker(void* arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "accel-pool");
  ask_short_slice();
  unsigned seen = pool.first_published;
  for (;;) {
    seen = await_job(seen);
    ACCEL_POOL_STRETCH(); /* a worker woken late: the job it was woken for may be over */
    claim_tasks(1);
  }
  return NULL;
}

/* A child process has none of the workers (nor a launch of another thread in progress).
 * Registered when the library loads, so that no fork comes before it. */
static void reset_after_fork(void) {
  pool.threads = 0;
  atomic_store(&pool.busy, 0);
  atomic_store(&pool.sleeping, 0);
}

__attribute__((constructor)) static void register_fork_handler(void) { pthread_atfork(NULL, NULL, reset_after_fork); }

static void start_workers(void) {
  const char* threads = getenv("TVM_NUM_THREADS");
  const char* spin = getenv("ACCEL_POOL_SPIN_US");
  int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (sched_getaffinity(0, sizeof pool.cpus, &pool.cpus) == 0)
    cores = CPU_COUNT(&pool.cpus);
  else
    CPU_ZERO(&pool.cpus); /* unknown: the workers stay where the scheduler puts them */
  int n = threads ? atoi(threads) : cores;
  pool.threads = n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
  pool.spin_us = spin ? atoi(spin) : 200;
  pool.first_published = atomic_load(&pool.published);
  atomic_store(&pool.caller_cpu, -1);
  for (int i = 1; i < pool.threads; ++i) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int failed = pthread_create(&pool.workers[i], &attr, worker, NULL);
    pthread_attr_destroy(&attr);
    if (failed) { /* the process may start no more threads: a pool of those started so far */
      pool.threads = i;
      break;
    }
  }
}

/* A job of `num_task` tasks of `f` for the workers (none of it for them while held). */
static void publish(parallel_lambda f, void* cdata, int num_task, int held) {
  /* close the last job first: a worker that read its word and reads the new fields below
   * must then fail to claim with that word (else it runs a task of the new job that the
   * word says nobody has claimed: twice) */
  uint64_t generation = (atomic_load(&pool.claims) >> 32) + 1;
  atomic_store_explicit(&pool.claims, generation << 32 | CLOSED, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  atomic_store_explicit(&pool.lambda, f, memory_order_relaxed);
  atomic_store_explicit(&pool.cdata, cdata, memory_order_relaxed);
  atomic_store_explicit(&pool.num_task, num_task, memory_order_relaxed);
  atomic_store(&pool.done, 0);
  atomic_store(&pool.failed, 0);
  ACCEL_POOL_STRETCH();
  atomic_store_explicit(&pool.claims, generation << 32, memory_order_release);
  if (held) return;
  atomic_fetch_add(&pool.published, 1);
  if (atomic_load(&pool.sleeping) > 0) futex(&pool.published, FUTEX_WAKE, INT32_MAX);
}

int accel_parallel_launch(parallel_lambda f, void* cdata, int num_task) {
  int expected = 0;
  if (in_task || !atomic_compare_exchange_strong(&pool.busy, &expected, 1)) {
    /* the workers are another launch's: the kernel as one task, on this thread */
    group_env env = {&pool, 1};
    atomic_fetch_add_explicit(&pool.launches, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool.launches_alone, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool.tasks_by_caller, 1, memory_order_relaxed);
    return f(0, &env, cdata) == 0 ? 0 : -1;
  }
  if (pool.threads == 0) start_workers();
  atomic_fetch_add_explicit(&pool.launches, 1, memory_order_relaxed);
  /* TVM asks for 0 (as many as there are threads) unless the schedule set a count */
  if (num_task <= 0) num_task = pool.threads;
  int cpu = sched_getcpu();
  int last_cpu = atomic_exchange_explicit(&pool.caller_cpu, cpu, memory_order_relaxed);
  if (cpu >= 0 && cpu != last_cpu) keep_workers_off(cpu);
  publish(f, cdata, num_task, atomic_load(&pool.held));
  claim_tasks(0);
  int64_t until = now_us() + JOIN_SPIN_US;
  while (atomic_load(&pool.done) < num_task && now_us() < until) CPU_RELAX();
  if (atomic_load(&pool.done) < num_task) {
    /* set before reading `done`: a worker adds to `done`, then reads this */
    atomic_store(&pool.caller_waits, 1);
    for (int done; (done = atomic_load(&pool.done)) < num_task;) futex(&pool.done, FUTEX_WAIT, (unsigned)done);
    atomic_store(&pool.caller_waits, 0);
  }
  int failed = atomic_load(&pool.failed);
  atomic_store(&pool.busy, 0);
  return failed ? -1 : 0;
}

/* For tests: while `hold` is nonzero, launches do not tell the workers, as if another
 * library's threads kept every worker off its core. */
void accel_pool_hold(int hold) { atomic_store(&pool.held, hold); }

/* For tests and benchmarks: the counters of `pool`, in their order there. */
void accel_pool_stats(long* out) {
  out[0] = atomic_load(&pool.launches);
  out[1] = atomic_load(&pool.launches_alone);
  out[2] = atomic_load(&pool.tasks_by_caller);
  out[3] = atomic_load(&pool.tasks_by_workers);
}
