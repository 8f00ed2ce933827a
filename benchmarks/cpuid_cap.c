/* Make a process and its children see an AVX2-only CPU, as closely as this host can play one:
 * loaded by LD_PRELOAD with ACCEL_AVX2_HOST=1 (benchmarks/cpuid_cap.py sets both). Under QEMU's
 * Haswell (ACCEL_AVX2_HOST=qemu), whose CPUID already lacks those features, only the
 * /proc/cpuinfo filter acts: QEMU's user mode passes the host's file through. With
 * ACCEL_AVX2_HOST=patched (no CPUID faulting: libraries whose CPUID and XGETBV cpuid_cap.py
 * replaced by software interrupts), on_segv answers those interrupts as it answers a
 * faulting CPUID, and XGETBV without the AVX-512 and AMX state.
 *
 * - CPUID: Linux's CPUID faulting (arch_prctl ARCH_SET_CPUID, 0; kept by the threads a
 *   thread starts, dropped by execve, where the preload sets it again) turns every CPUID
 *   instruction into a SIGSEGV. The handler runs the real CPUID with faulting off, clears
 *   AVX-512*, AVX-VNNI and AMX, reports Haswell's model, or Zen 3's on an AMD host (LLVM
 *   names the host CPU by its model), and steps over the instruction. Any other SIGSEGV goes
 *   to the handler the program installed, or kills the process as it would have.
 * - SIGSEGV handlers the program installs (TVM's, Python's faulthandler) become the one this
 *   handler passes other faults to, instead of replacing it.
 * - /proc/cpuinfo reads without the cleared features' flags.
 *
 * What read CPUID before the preload's constructor (the dynamic loader's choice of glibc's
 * string functions) keeps what it read. XGETBV still reports the AVX-512 register state
 * enabled; software that checks CPUID first, as it must, does not get that far. */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static struct sigaction previous;
static int handling; /* ACCEL_AVX2_HOST=1 or patched: on_segv owns SIGSEGV */
static int trapping;  /* ACCEL_AVX2_HOST=1: CPUID faults into on_segv (CPUID faulting) */
static int filtering; /* ACCEL_AVX2_HOST=1, qemu or patched: /proc/cpuinfo reads are filtered */

/* The model CPUID leaf 1's EAX reports, from which LLVM names the CPU: an Intel host's is
 * Haswell's (family 6, model 0x3C, stepping 3), an AMD host's Zen 3's (family 0x19, model 1,
 * stepping 1: EPYC Milan, an AVX2-only CPU); Haswell's model on an AMD CPU is an Athlon XP. */
#define HASWELL_SIGNATURE 0x000306C3u
#define ZEN3_SIGNATURE 0x00A00F11u
#define AMD_VENDOR_EBX 0x68747541u /* "Auth" of AuthenticAMD */
static uint32_t signature = HASWELL_SIGNATURE;

typedef int (*sigaction_fn)(int, const struct sigaction*, struct sigaction*);

static int real_sigaction(int sig, const struct sigaction* act, struct sigaction* old) {
  static sigaction_fn next;
  if (!next) next = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
  return next(sig, act, old);
}

static void real_cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
  __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
}

/* leaf 7 subleaf 0: EBX AVX512F, DQ, IFMA, PF, ER, CD, BW, VL; ECX AVX512_VBMI, VBMI2, VNNI,
 * BITALG, VPOPCNTDQ; EDX AVX512_4VNNIW, 4FMAPS, VP2INTERSECT, AMX_BF16, AVX512_FP16,
 * AMX_TILE, AMX_INT8. leaf 7 subleaf 1: EAX AVX_VNNI, AVX512_BF16, AMX_FP16. */
static void cap(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
  if (leaf == 1) {
    r[0] = signature;
  } else if (leaf == 7 && sub == 0) {
    r[1] &= ~((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) | (1u << 30) | (1u << 31));
    r[2] &= ~((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14));
    r[3] &= ~((1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) | (1u << 25));
  } else if (leaf == 7 && sub == 1) {
    r[0] &= ~((1u << 4) | (1u << 5) | (1u << 21));
  }
}

/* XCR0 (XGETBV 0) without the AVX-512 (opmask, ZMM_Hi256, Hi16_ZMM) and AMX (TILECFG,
 * TILEDATA) state components: what an AVX2-only CPU's OS enables */
static void xgetbv_capped(uint32_t index, uint32_t r[2]) {
  __asm__ volatile("xgetbv" : "=a"(r[0]), "=d"(r[1]) : "c"(index));
  if (index == 0) r[0] &= ~((1u << 5) | (1u << 6) | (1u << 7) | (1u << 17) | (1u << 18));
}

/* The instructions on_segv answers for, all general protection faults (SI_KERNEL): CPUID
 * under CPUID faulting, and the software interrupts cpuid_cap.py writes over a library's
 * CPUID (INT 0xA2) and XGETBV (INT 0xA3; NOP) where the host has no CPUID faulting. */
static int answers(const unsigned char* ip) {
  if (trapping && ip[0] == 0x0f && ip[1] == 0xa2) return 2;
  if (ip[0] == 0xcd && ip[1] == 0xa2) return 2;
  if (ip[0] == 0xcd && ip[1] == 0xa3 && ip[2] == 0x90) return 3;
  return 0;
}

static void on_segv(int sig, siginfo_t* info, void* context) {
  ucontext_t* uc = context;
  greg_t* g = uc->uc_mcontext.gregs;
  const unsigned char* ip = (const unsigned char*)g[REG_RIP];
  int length = info->si_code == SI_KERNEL ? answers(ip) : 0;
  if (!length) { /* whatever would have happened */
    if (previous.sa_flags & SA_SIGINFO) {
      previous.sa_sigaction(sig, info, context);
      return;
    }
    if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
      previous.sa_handler(sig);
      return;
    }
    struct sigaction fatal;
    memset(&fatal, 0, sizeof fatal);
    fatal.sa_handler = SIG_DFL;
    real_sigaction(SIGSEGV, &fatal, NULL);
    return; /* the instruction faults again, now fatally */
  }
  uint32_t r[4];
  if (ip[1] == 0xa3) {
    xgetbv_capped((uint32_t)g[REG_RCX], r);
    g[REG_RAX] = r[0];
    g[REG_RDX] = r[1];
  } else {
    uint32_t leaf = (uint32_t)g[REG_RAX], sub = (uint32_t)g[REG_RCX];
    if (trapping) syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
    real_cpuid(leaf, sub, r);
    if (trapping) syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
    cap(leaf, sub, r);
    g[REG_RAX] = r[0];
    g[REG_RBX] = r[1];
    g[REG_RCX] = r[2];
    g[REG_RDX] = r[3];
  }
  g[REG_RIP] += length;
}

/* Make on_segv the SIGSEGV handler; -1 if that fails. */
static int handle_segv(void) {
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_sigaction = on_segv;
  action.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  if (real_sigaction(SIGSEGV, &action, &previous) != 0) return -1;
  handling = 1;
  return 0;
}

/* 0 on success; -1 where the kernel or the CPU has no CPUID faulting. */
static int cap_cpuid(void) {
  if (handle_segv() != 0) return -1;
  if (syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) != 0) return -1;
  trapping = 1;
  return 0;
}

/* Handlers for SIGSEGV installed after ours are the ones ours passes other faults to. */
int sigaction(int sig, const struct sigaction* act, struct sigaction* old) {
  if (!handling || sig != SIGSEGV) return real_sigaction(sig, act, old);
  struct sigaction was = previous;
  if (act) previous = *act;
  if (old) *old = was;
  return 0;
}

sighandler_t signal(int sig, sighandler_t handler) {
  struct sigaction act, old;
  memset(&act, 0, sizeof act);
  act.sa_handler = handler;
  act.sa_flags = SA_RESTART;
  sigemptyset(&act.sa_mask);
  if (sigaction(sig, &act, &old) != 0) return SIG_ERR;
  return old.sa_handler;
}

static int capped_flag(const char* flag, size_t n) {
  static const char* prefixes[] = {"avx512", "amx_", "avx_vnni"};
  for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++) {
    size_t p = strlen(prefixes[i]);
    if (n >= p && strncmp(flag, prefixes[i], p) == 0) return 1;
  }
  return 0;
}

typedef int (*openat_fn)(int, const char*, int, ...);

/* A memory file holding /proc/cpuinfo without the capped flags, or -1 (then the real file). */
static int filtered_cpuinfo(void) {
  static openat_fn next;
  if (!next) next = (openat_fn)dlsym(RTLD_NEXT, "openat");
  int in = next(AT_FDCWD, "/proc/cpuinfo", O_RDONLY | O_CLOEXEC);
  if (in < 0) return -1;
  size_t size = 0, cap_size = 1 << 16;
  char* text = malloc(cap_size);
  ssize_t got;
  while (text && (got = read(in, text + size, cap_size - size)) > 0) {
    size += (size_t)got;
    if (size == cap_size) text = realloc(text, cap_size *= 2);
  }
  close(in);
  int out = text ? memfd_create("cpuinfo", MFD_CLOEXEC) : -1;
  if (out < 0) {
    free(text);
    return -1;
  }
  FILE* f = fdopen(dup(out), "w");
  for (char *line = text, *end = text + size; f && line < end;) {
    char* eol = memchr(line, '\n', (size_t)(end - line));
    if (!eol) eol = end;
    int flags_line = strncmp(line, "flags", 5) == 0 || strncmp(line, "Features", 8) == 0;
    char* colon = flags_line ? memchr(line, ':', (size_t)(eol - line)) : NULL;
    if (!colon) {
      fwrite(line, 1, (size_t)(eol - line), f);
    } else {
      fwrite(line, 1, (size_t)(colon + 1 - line), f);
      for (char* word = colon + 1; word < eol;) {
        while (word < eol && *word == ' ') word++;
        char* stop = word;
        while (stop < eol && *stop != ' ') stop++;
        if (stop > word && !capped_flag(word, (size_t)(stop - word))) {
          fputc(' ', f);
          fwrite(word, 1, (size_t)(stop - word), f);
        }
        word = stop;
      }
    }
    if (eol < end) fputc('\n', f);
    line = eol + 1;
  }
  if (f) fclose(f);
  free(text);
  lseek(out, 0, SEEK_SET);
  return out;
}

static int is_cpuinfo(const char* path) { return filtering && path && strcmp(path, "/proc/cpuinfo") == 0; }

#define OPEN_MODE(flags, mode)              \
  mode_t mode = 0;                          \
  if ((flags) & (O_CREAT | O_TMPFILE)) {    \
    va_list args;                           \
    va_start(args, flags);                  \
    mode = (mode_t)va_arg(args, int);       \
    va_end(args);                           \
  }

int open(const char* path, int flags, ...) {
  OPEN_MODE(flags, mode);
  int fd = is_cpuinfo(path) ? filtered_cpuinfo() : -1;
  return fd >= 0 ? fd : openat(AT_FDCWD, path, flags, mode);
}

int open64(const char* path, int flags, ...) {
  OPEN_MODE(flags, mode);
  return open(path, flags, mode);
}

int openat(int dir, const char* path, int flags, ...) {
  static openat_fn next;
  OPEN_MODE(flags, mode);
  if (!next) next = (openat_fn)dlsym(RTLD_NEXT, "openat");
  int fd = is_cpuinfo(path) ? filtered_cpuinfo() : -1;
  return fd >= 0 ? fd : next(dir, path, flags, mode);
}

int openat64(int dir, const char* path, int flags, ...) {
  OPEN_MODE(flags, mode);
  return openat(dir, path, flags, mode);
}

typedef FILE* (*fopen_fn)(const char*, const char*);

FILE* fopen(const char* path, const char* mode) {
  static fopen_fn next;
  if (!next) next = (fopen_fn)dlsym(RTLD_NEXT, "fopen");
  int fd = is_cpuinfo(path) ? filtered_cpuinfo() : -1;
  return fd >= 0 ? fdopen(fd, "r") : next(path, mode);
}

FILE* fopen64(const char* path, const char* mode) { return fopen(path, mode); }

__attribute__((constructor)) static void start(void) {
  const char* on = getenv("ACCEL_AVX2_HOST");
  if (!on) return;
  int faulting = strcmp(on, "1") == 0, patched = strcmp(on, "patched") == 0;
  uint32_t vendor[4];
  real_cpuid(0, 0, vendor); /* (before CPUID faults) */
  if (vendor[1] == AMD_VENDOR_EBX) signature = ZEN3_SIGNATURE;
  filtering = faulting || patched || strcmp(on, "qemu") == 0;
  if (patched && handle_segv() != 0) {
    fputs("cpuid_cap: cannot handle SIGSEGV\n", stderr);
    _exit(70);
  }
  if (faulting && cap_cpuid() != 0) {
    fputs("cpuid_cap: this CPU or kernel has no CPUID faulting (arch_prctl ARCH_SET_CPUID)\n", stderr);
    _exit(70);
  }
}
