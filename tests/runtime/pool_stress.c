/* A stress test of accel's pool (accel_target/runtime/pool.c, included below), run by
 * test_pool.py.
 *
 * One thread launches, over and over, a kernel of one task and then a kernel of SECOND_TASKS
 * tasks (as a schedule that sets its count asks), on a pool of two threads, each pinned to a
 * CPU of its own (where the process has two). ACCEL_POOL_STRETCH pauses for STRETCH_NS at the
 * places where a worker reading the job and the caller publishing the next one may interleave,
 * so that an interleaving a model meets once in millions of launches comes within a few
 * thousand.
 *
 * With "no-workers" after the rounds, the pool's worker does not start (pthread_create fails,
 * as in a process that may start no more threads): the caller runs every task.
 *
 * With "slow-worker" after the rounds, a task of the second launch takes 20 us on the caller and
 * 300 us on the worker: the caller, done with the others, waits for the worker's longer than
 * it spins, on a futex the worker wakes.
 *
 * With "one-cpu" after the rounds, the caller and the worker run on one CPU: the worker, on the
 * caller's CPU, must run none of the tasks.
 *
 * With "held" after the rounds, the second launch of each round, its first task taking
 * 100 us, is made while the workers are held (accel_pool_hold): the worker, woken by the first
 * launch and reaching the second late, must run none of its tasks. "by both threads" then
 * counts the held launches the worker took part in.
 *
 * Every launch must run each of its tasks exactly once, with the job's own data, and end.
 * Prints "launches L, by both threads B" and exits 0; or exits 1 naming the first wrong
 * launch; or 2 if a launch does not end within TIMEOUT_S seconds. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef STRETCH_NS
#define STRETCH_NS 5000
#endif
#ifndef TIMEOUT_S
#define TIMEOUT_S 60
#endif

static void busy_wait(long ns) {
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  do clock_gettime(CLOCK_MONOTONIC, &now);
  while ((now.tv_sec - start.tv_sec) * 1000000000L + (now.tv_nsec - start.tv_nsec) < ns);
}
static void stretch(void) { busy_wait(STRETCH_NS); }
#define ACCEL_POOL_STRETCH() stretch()

static int refuse_threads;
static int worker_cpu = -1; /* where the worker runs, if pinned */
static int create_thread(pthread_t* thread, const pthread_attr_t* attr, void* (*run)(void*), void* arg) {
  if (refuse_threads) return EAGAIN;
  if (worker_cpu < 0) return pthread_create(thread, attr, run, arg);
  pthread_attr_t pinned; /* the pool's worker is detached, as pool.c makes it */
  cpu_set_t cpu;
  CPU_ZERO(&cpu);
  CPU_SET(worker_cpu, &cpu);
  pthread_attr_init(&pinned);
  pthread_attr_setdetachstate(&pinned, PTHREAD_CREATE_DETACHED);
  pthread_attr_setaffinity_np(&pinned, sizeof cpu, &cpu);
  int failed = pthread_create(thread, &pinned, run, arg);
  pthread_attr_destroy(&pinned);
  return failed;
}

/* Run this thread on one CPU and, unless `alone`, the worker on another (where the process has
 * two). The pool's CPUs are then this thread's one: a worker on it has nowhere to go and naps. */
static int pin(int alone) {
  cpu_set_t allowed, cpu;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return -1;
  int first = -1;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &allowed)) continue;
    if (first < 0) first = c;
    else if (!alone) {
      worker_cpu = c;
      break;
    }
  }
  CPU_ZERO(&cpu);
  CPU_SET(first, &cpu);
  return sched_setaffinity(0, sizeof cpu, &cpu);
}
#define pthread_create create_thread
#include "pool.c"
#undef pthread_create

#define MAX_TASKS 1024

#define SECOND_TASKS 8 /* more tasks than threads: the worker claims some while the caller runs */

typedef struct {
  int launch;
} job_data;

static atomic_int current_launch, wrong_data, tasks_seen;
static atomic_int runs[MAX_TASKS];

static int count_run(int task, group_env* env, void* cdata) {
  atomic_fetch_add(&runs[task], 1);
  atomic_store(&tasks_seen, env->num_task);
  if (((job_data*)cdata)->launch != atomic_load(&current_launch)) atomic_store(&wrong_data, 1);
  return 0;
}

static pthread_t caller;

/* A task takes 20 us on the caller, 300 us on the worker. */
static int slow_on_worker(int task, group_env* env, void* cdata) {
  count_run(task, env, cdata);
  busy_wait(pthread_equal(pthread_self(), caller) ? 20000 : 300000);
  return 0;
}

/* Task 0 takes 100 us: the job stays open for a worker that comes late. */
static int slow_first_task(int task, group_env* env, void* cdata) {
  count_run(task, env, cdata);
  if (task == 0) busy_wait(100000);
  return 0;
}

static void on_timeout(int signal) {
  (void)signal;
  static const char message[] = "a launch did not end\n";
  (void)!write(2, message, sizeof message - 1);
  _exit(2);
}

/* Launch f as `launch` and check that each task ran once with the launch's data; the number
 * of tasks, or 0 on a fault. */
static int launch_and_check(parallel_lambda f, int num_task, int launch) {
  job_data data = {launch};
  memset(runs, 0, sizeof runs);
  atomic_store(&current_launch, launch);
  atomic_store(&tasks_seen, 0);
  if (accel_parallel_launch(f, &data, num_task) != 0) {
    fprintf(stderr, "launch %d failed\n", launch);
    return 0;
  }
  int tasks = atomic_load(&tasks_seen);
  for (int task = 0; task < MAX_TASKS; ++task) {
    int expected = task < tasks ? 1 : 0;
    if (atomic_load(&runs[task]) != expected) {
      fprintf(stderr, "launch %d (%d tasks): task %d ran %d times\n", launch, tasks, task, atomic_load(&runs[task]));
      return 0;
    }
  }
  if (atomic_load(&wrong_data)) {
    fprintf(stderr, "launch %d: a task ran with another launch's data\n", launch);
    return 0;
  }
  return tasks;
}

int main(int argc, char** argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 2000;
  refuse_threads = argc > 2 && strcmp(argv[2], "no-workers") == 0;
  int held = argc > 2 && strcmp(argv[2], "held") == 0;
  int slow = argc > 2 && strcmp(argv[2], "slow-worker") == 0;
  caller = pthread_self();
  if (pin(argc > 2 && strcmp(argv[2], "one-cpu") == 0) != 0) return 3;
  setenv("TVM_NUM_THREADS", "2", 1);
  signal(SIGALRM, on_timeout);
  alarm(TIMEOUT_S);
  int both = 0;
  for (int round = 0; round < rounds; ++round) {
    if (!launch_and_check(count_run, 1, 2 * round)) return 1;
    long before[4], after[4];
    accel_pool_stats(before);
    if (held) accel_pool_hold(1);
    parallel_lambda second = held ? slow_first_task : slow ? slow_on_worker : count_run;
    int tasks = launch_and_check(second, SECOND_TASKS, 2 * round + 1);
    if (held) accel_pool_hold(0);
    accel_pool_stats(after);
    if (!tasks) return 1;
    both += after[3] != before[3];
  }
  printf("launches %d, by both threads %d\n", 2 * rounds, both);
  return 0;
}
