// dev/emu/program.cpp — builds a GPU program (a top-level trainer, train_ldm.cu or
// train_gpt_baselines.cu) as a host binary whose every kernel runs under the CUDA emulation of
// dev/emu (Makefile: build/emu/<program>). EMU_PROGRAM names the emulation copy that
// dev/emu/gen.py wrote (e.g. "cuda_emu/train_ldm.cu.h"); its main() is the program's own, so the
// emulated trainer takes the same flags, reads the same data and writes the same logs and
// checkpoints as the real one, on host memory and without a GPU (doc/cuda.md "Emulating kernels
// on the CPU"). Slow (each CUDA thread is a fiber): for tiny shapes in tests.
#ifndef EMU_PROGRAM
#error "define EMU_PROGRAM, e.g. -DEMU_PROGRAM='\"cuda_emu/train_ldm.cu.h\"'"
#endif
#include EMU_PROGRAM
