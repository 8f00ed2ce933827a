/* Make this process see an AVX2 CPU: CPUID answers without AVX-512, AVX-VNNI and AMX.
 *
 * For benchmarks on an AVX-512 host that want AVX2 figures from libraries that pick their
 * kernels from CPUID and have no switch of their own (ONNX Runtime's MLAS). Linux's CPUID
 * faulting (arch_prctl ARCH_SET_CPUID, 0) turns every CPUID instruction of this thread, and
 * of the threads it starts from then on, into a SIGSEGV; the handler runs the real CPUID
 * with faulting off, clears the features, and steps over the instruction. A SIGSEGV that is
 * not a CPUID goes to the handler installed before, or kills the process as it would have.
 *
 * What has already read CPUID (the dynamic loader, libraries loaded before) keeps what it
 * read: call accel_cpuid_cap_avx2() before loading the library to be capped. */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static struct sigaction previous;

static void real_cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
  __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
}

/* leaf 7 subleaf 0: EBX AVX512F, DQ, IFMA, PF, ER, CD, BW, VL; ECX AVX512_VBMI, VBMI2, VNNI,
 * BITALG, VPOPCNTDQ; EDX AVX512_4VNNIW, 4FMAPS, VP2INTERSECT, AMX_BF16, AVX512_FP16,
 * AMX_TILE, AMX_INT8. leaf 7 subleaf 1: EAX AVX_VNNI, AVX512_BF16, AMX_FP16. */
static void cap(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
  if (leaf != 7) return;
  if (sub == 0) {
    r[1] &= ~((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) | (1u << 30) | (1u << 31));
    r[2] &= ~((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14));
    r[3] &= ~((1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) | (1u << 25));
  } else if (sub == 1) {
    r[0] &= ~((1u << 4) | (1u << 5) | (1u << 21));
  }
}

static void on_segv(int sig, siginfo_t* info, void* context) {
  ucontext_t* uc = context;
  greg_t* g = uc->uc_mcontext.gregs;
  const unsigned char* ip = (const unsigned char*)g[REG_RIP];
  if (ip[0] != 0x0f || ip[1] != 0xa2) { /* not CPUID: whatever would have happened */
    if (previous.sa_flags & SA_SIGINFO) {
      previous.sa_sigaction(sig, info, context);
      return;
    }
    if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
      previous.sa_handler(sig);
      return;
    }
    signal(SIGSEGV, SIG_DFL);
    return; /* the instruction faults again, now fatally */
  }
  uint32_t r[4], leaf = (uint32_t)g[REG_RAX], sub = (uint32_t)g[REG_RCX];
  syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
  real_cpuid(leaf, sub, r);
  syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
  cap(leaf, sub, r);
  g[REG_RAX] = r[0];
  g[REG_RBX] = r[1];
  g[REG_RCX] = r[2];
  g[REG_RDX] = r[3];
  g[REG_RIP] += 2;
}

/* CPUID of this thread as it is again (threads started meanwhile stay capped). */
void accel_cpuid_uncap(void) { syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1); }

/* 0 on success; -1 where the kernel or the CPU has no CPUID faulting. */
int accel_cpuid_cap_avx2(void) {
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_sigaction = on_segv;
  action.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  if (sigaction(SIGSEGV, &action, &previous) != 0) return -1;
  if (syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) != 0) {
    sigaction(SIGSEGV, &previous, NULL);
    return -1;
  }
  return 0;
}
