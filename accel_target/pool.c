/* accel's thread pool: what TVM's TVMBackendParallelLaunch / TVMBackendParallelBarrier do,
 * for a process that other libraries' threads share (accel_target/pool.py installs it).
 *
 * TVM's launch hands task i to worker i and waits until every worker has run its task; a
 * worker whose core another library's spinning thread holds starts a scheduler quantum
 * later, and the kernel waits for it. Here a task is claimed, by whichever thread gets to
 * it first: the caller runs task 0, then claims the tasks that no worker has started, and
 * waits only for tasks that a worker is running. A worker that wakes late finds nothing
 * left to do.
 *
 * A launch whose tasks meet at barriers (accel's shared launches) needs all its tasks
 * running at once, so the caller cannot run a late worker's task itself. The first such
 * launch of a kernel waits at the barrier as TVM's does, and the pool remembers the kernel;
 * from then on a launch of it takes as many tasks as there are threads on a core now (the
 * caller and the workers that checked for a job within the last RUNNING_US): one if
 * another library's thread holds their cores (a single task meets no barrier). Sleeping
 * workers are woken first and waited for, a little (`wake_sleepers`).
 *
 * The job is one 64-bit word, generation << 32 | tasks claimed, that tasks are claimed
 * from with a compare-and-swap. A new job first closes the word (a new generation, every
 * task claimed), then writes its fields, then opens the word: a claim that succeeds was
 * made on the current job, so the job's fields read before it are that job's.
 *
 * Between launches a worker spins for ACCEL_POOL_SPIN_US microseconds (default 200;
 * sched_yield, so that other threads on its core run first), counted from the end of the
 * last launch, then sleeps on a futex. One launch at a time
 * uses the workers; a launch from another thread meanwhile, or from inside a task, runs
 * its kernel as one task on its own thread. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  void* sync_handle;
  int32_t num_task;
} group_env;
typedef int (*parallel_lambda)(int task_id, group_env* env, void* cdata);

#define MAX_THREADS 256
#define MAX_BARRIER_KERNELS 1024
#define RUNNING_US 20
#define WAKE_WAIT_US 200
#define CLOSED 0x7fffffffu /* tasks claimed, of a job being published: none left */

/* For tests (tests/accel_target/pool_stress.c): a pause where two threads' steps may
 * interleave, to make a rare interleaving common. Nothing here. */
#ifndef ACCEL_POOL_STRETCH
#define ACCEL_POOL_STRETCH() ((void)0)
#endif

static struct {
  int threads; /* the caller and threads - 1 workers; 0 until the first launch */
  int spin_us;
  atomic_int busy; /* a launch holds the workers */
  /* the job */
  _Atomic(parallel_lambda) lambda;
  _Atomic(void*) cdata;
  atomic_int num_task;
  _Atomic uint64_t claims; /* generation << 32 | tasks claimed */
  atomic_int done;
  atomic_int failed;
  atomic_int arrived;                /* the barrier */
  atomic_uint barrier_round;
  atomic_uint published;             /* futex word: one more per job */
  atomic_int sleeping;               /* workers asleep on `published` */
  unsigned first_published;          /* `published` when the workers started */
  _Atomic int64_t seen_at[MAX_THREADS]; /* when each worker last checked for a job, in us */
  _Atomic(parallel_lambda) barrier_kernels[MAX_BARRIER_KERNELS];
  atomic_int barrier_work_us[MAX_BARRIER_KERNELS]; /* each one's last launch: us x tasks */
  atomic_int held;       /* accel_pool_hold */
  atomic_int caller_cpu; /* the core of the thread that launched last */
  /* accel_pool_stats: launches; of them run as one task on the launching thread because the
   * workers were busy; tasks the launching threads ran; tasks the workers ran */
  atomic_long launches, launches_alone, tasks_by_caller, tasks_by_workers;
} pool;

static _Thread_local int in_task; /* the thread runs a task (nested launches run alone) */

static void futex(atomic_uint* word, int op, unsigned value) {
  syscall(SYS_futex, word, op | FUTEX_PRIVATE_FLAG, value, NULL, NULL, 0);
}

/* One round of waiting for another thread: a few pauses, then yield the core (a thread we
 * wait for may be waiting for it). */
static inline void back_off(int spins) {
  if (spins < 32) __builtin_ia32_pause();
  else sched_yield();
}

static int64_t now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

/* f's place among the kernels known to meet barriers, or -1. */
static int barrier_kernel(parallel_lambda f) {
  for (int i = 0; i < MAX_BARRIER_KERNELS; ++i) {
    parallel_lambda known = atomic_load_explicit(&pool.barrier_kernels[i], memory_order_relaxed);
    if (known == f) return i;
    if (known == NULL) return -1;
  }
  return -1;
}

static void remember_barriers(parallel_lambda f) {
  for (int i = 0; i < MAX_BARRIER_KERNELS; ++i) {
    parallel_lambda expected = NULL;
    if (atomic_compare_exchange_strong(&pool.barrier_kernels[i], &expected, f) || expected == f) return;
  }
}

static void run_task(parallel_lambda f, void* cdata, int task, int num_task, int by_worker) {
  group_env env = {&pool, num_task};
  in_task = 1;
  if (f(task, &env, cdata) != 0) atomic_store(&pool.failed, 1);
  in_task = 0;
  atomic_fetch_add_explicit(by_worker ? &pool.tasks_by_workers : &pool.tasks_by_caller, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
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

/* Keeping workers off the launching thread's core. The OS wakes a sleeping worker on the
 * core of the thread that wakes it, as often as not, and there it shares that core with the
 * caller until the OS balances the load: on a 2-core VM, tens of ms (a 256x1024x1024 dense
 * at one core's speed, 3.6 instead of 2.0 ms, call after call). So the launch lets a sleeping
 * worker wake on the other cores only (`wake_elsewhere`), and the worker, once awake, may run
 * anywhere again; a spinning worker that finds itself on the caller's core moves off it
 * (`leave_callers_core`). */
static cpu_set_t allowed_cpus; /* the process's cores when the workers started */
static _Atomic pid_t worker_tid[MAX_THREADS];

static int others_than(int cpu, cpu_set_t* others) {
  *others = allowed_cpus;
  CPU_CLR(cpu, others);
  return cpu >= 0 && CPU_COUNT(others) > 0 && CPU_COUNT(others) < CPU_COUNT(&allowed_cpus);
}

static void wake_elsewhere(int caller_cpu) {
  cpu_set_t others;
  if (!others_than(caller_cpu, &others)) return;
  for (int i = 1; i < pool.threads; ++i) {
    pid_t tid = atomic_load(&worker_tid[i]);
    if (tid && atomic_load_explicit(&pool.seen_at[i], memory_order_relaxed) == 0)
      sched_setaffinity(tid, sizeof others, &others);
  }
}

static void leave_callers_core(void) {
  int cpu = sched_getcpu();
  cpu_set_t others;
  if (cpu != atomic_load_explicit(&pool.caller_cpu, memory_order_relaxed) || !others_than(cpu, &others)) return;
  if (sched_setaffinity(0, sizeof others, &others) == 0) sched_setaffinity(0, sizeof allowed_cpus, &allowed_cpus);
}

static void* worker(void* arg) {
  int index = (int)(intptr_t)arg;
  unsigned seen = pool.first_published;
  atomic_store(&worker_tid[index], (pid_t)syscall(SYS_gettid));
  for (;;) {
    int64_t until = now_us() + pool.spin_us;
    atomic_store_explicit(&pool.seen_at[index], until - pool.spin_us, memory_order_relaxed);
    while (atomic_load_explicit(&pool.published, memory_order_acquire) == seen) {
      int64_t now = now_us();
      atomic_store_explicit(&pool.seen_at[index], now, memory_order_relaxed);
      /* the spin counts from the end of the launch in progress (one its caller runs alone,
       * having woken this worker too late): awake, the worker is there for the next */
      if (atomic_load_explicit(&pool.busy, memory_order_relaxed)) until = now + pool.spin_us;
      if (now < until) {
        leave_callers_core();
        sched_yield();
        continue;
      }
      atomic_store_explicit(&pool.seen_at[index], 0, memory_order_relaxed);
      atomic_fetch_add(&pool.sleeping, 1);
      while (atomic_load(&pool.published) == seen) futex(&pool.published, FUTEX_WAIT, seen);
      atomic_fetch_sub(&pool.sleeping, 1);
      sched_setaffinity(0, sizeof allowed_cpus, &allowed_cpus); /* undo wake_elsewhere */
    }
    seen = atomic_load_explicit(&pool.published, memory_order_acquire);
    ACCEL_POOL_STRETCH(); /* a worker woken late: the job it was woken for may be over */
    leave_callers_core();
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
  int n = threads ? atoi(threads) : (int)sysconf(_SC_NPROCESSORS_ONLN);
  pool.threads = n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
  pool.spin_us = spin ? atoi(spin) : 200;
  pool.first_published = atomic_load(&pool.published);
  sched_getaffinity(0, sizeof allowed_cpus, &allowed_cpus);
  for (int i = 1; i < pool.threads; ++i) {
    atomic_store(&pool.seen_at[i], 0);
    atomic_store(&worker_tid[i], 0);
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int failed = pthread_create(&thread, &attr, worker, (void*)(intptr_t)i);
    pthread_attr_destroy(&attr);
    if (failed) { /* the process may start no more threads: a pool of those started so far */
      pool.threads = i;
      break;
    }
  }
}

/* Workers on a core now: they checked for a job within the last RUNNING_US. A worker that
 * shares its core with another library's busy thread checks in turn with it, or not at all
 * (sched_yield lets the other thread run first). */
static int workers_running(void) {
  int64_t now = now_us();
  int running = 0;
  for (int i = 1; i < pool.threads; ++i)
    running += now - atomic_load_explicit(&pool.seen_at[i], memory_order_relaxed) < RUNNING_US;
  return running;
}

/* A job for the workers: `num_task` tasks of `f`, task 0 the caller's. A job of one task
 * too wakes sleeping workers, for the launches to come (unless `held`). */
static void publish(parallel_lambda f, void* cdata, int num_task, int held) {
  /* close the last job first: a worker that read its word and reads the new fields below
   * must then fail to claim with that word (else it runs a task of the new job that the
   * word says nobody has claimed: twice, the second time alone at the job's barrier) */
  uint64_t generation = (atomic_load(&pool.claims) >> 32) + 1;
  atomic_store_explicit(&pool.claims, generation << 32 | CLOSED, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  atomic_store_explicit(&pool.lambda, f, memory_order_relaxed);
  atomic_store_explicit(&pool.cdata, cdata, memory_order_relaxed);
  atomic_store_explicit(&pool.num_task, num_task, memory_order_relaxed);
  atomic_store(&pool.done, 0);
  atomic_store(&pool.failed, 0);
  atomic_store(&pool.arrived, 0);
  ACCEL_POOL_STRETCH();
  atomic_store_explicit(&pool.claims, generation << 32 | 1, memory_order_release); /* task 0: ours */
  if (held) return;
  atomic_fetch_add(&pool.published, 1);
  if (atomic_load(&pool.sleeping) > 0) {
    wake_elsewhere(atomic_load_explicit(&pool.caller_cpu, memory_order_relaxed));
    futex(&pool.published, FUTEX_WAKE, INT32_MAX);
  }
}

/* Before a launch whose tasks meet at barriers, while workers sleep: wake them with a job
 * that has nothing for them, and wait for them to check in, at most `budget_us` (a quarter
 * of what the kernel's last launch took, summed over its tasks: the most that waiting for a
 * worker that does not come may cost), WAKE_WAIT_US at most. A woken worker checks in
 * within 20-50 us on a 2-core VM (its core was halted), or not until another library's
 * thread leaves its core. Without this, the first launch of every call of a model called
 * now and then would run alone on the caller. */
static void wake_sleepers(int budget_us) {
  if (budget_us > WAKE_WAIT_US) budget_us = WAKE_WAIT_US;
  publish(NULL, NULL, 1, 0);
  int64_t until = now_us() + budget_us;
  for (int spins = 0; workers_running() < pool.threads - 1 && now_us() < until; ++spins) back_off(spins);
}

int accel_parallel_launch(parallel_lambda f, void* cdata, int num_task) {
  int expected = 0;
  if (in_task || !atomic_compare_exchange_strong(&pool.busy, &expected, 1)) {
    /* the workers are another launch's: the kernel as one task, on this thread */
    group_env env = {&pool, 1};
    atomic_fetch_add(&pool.launches, 1);
    atomic_fetch_add(&pool.launches_alone, 1);
    atomic_fetch_add(&pool.tasks_by_caller, 1);
    return f(0, &env, cdata) == 0 ? 0 : -1;
  }
  if (pool.threads == 0) start_workers();
  atomic_fetch_add(&pool.launches, 1);
  atomic_store_explicit(&pool.caller_cpu, sched_getcpu(), memory_order_relaxed);
  int held = atomic_load(&pool.held);
  if (num_task <= 0 || num_task > pool.threads) num_task = pool.threads;
  int barriers = barrier_kernel(f);
  if (barriers >= 0) {
    if (!held && atomic_load(&pool.sleeping) > 0)
      wake_sleepers(atomic_load_explicit(&pool.barrier_work_us[barriers], memory_order_relaxed) / 4);
    int running = 1 + (held ? 0 : workers_running());
    if (num_task > running) num_task = running;
  }
  int64_t started = now_us();
  unsigned rounds = atomic_load(&pool.barrier_round);
  publish(f, cdata, num_task, held);
  run_task(f, cdata, 0, num_task, 0);
  claim_tasks(0);
  for (int spins = 0; atomic_load_explicit(&pool.done, memory_order_acquire) < num_task; ++spins) back_off(spins);
  if (barriers < 0 && atomic_load(&pool.barrier_round) != rounds) barriers = barrier_kernel(f); /* learned now */
  if (barriers >= 0)
    atomic_store_explicit(&pool.barrier_work_us[barriers], (int)((now_us() - started) * num_task),
                          memory_order_relaxed);
  int failed = atomic_load(&pool.failed);
  atomic_store(&pool.busy, 0);
  return failed ? -1 : 0;
}

int accel_parallel_barrier(int task_id, group_env* env) {
  (void)task_id;
  if (env->num_task <= 1) return 0;
  remember_barriers(atomic_load_explicit(&pool.lambda, memory_order_relaxed));
  unsigned round = atomic_load(&pool.barrier_round);
  if (atomic_fetch_add(&pool.arrived, 1) == env->num_task - 1) {
    atomic_store(&pool.arrived, 0);
    atomic_store(&pool.barrier_round, round + 1);
    return 0;
  }
  for (int spins = 0; atomic_load(&pool.barrier_round) == round; ++spins) back_off(spins);
  return 0;
}

/* For tests: while `hold` is nonzero, launches do not tell the workers, as if another
 * library's threads kept every worker off its core. */
void accel_pool_hold(int hold) { atomic_store(&pool.held, hold); }

/* For tests and reports: the counters of `pool`, in their order there. */
void accel_pool_stats(long* out) {
  out[0] = atomic_load(&pool.launches);
  out[1] = atomic_load(&pool.launches_alone);
  out[2] = atomic_load(&pool.tasks_by_caller);
  out[3] = atomic_load(&pool.tasks_by_workers);
}
