# Build for the LDM project. `make` builds the CPU tools (always) and the CUDA trainers and
# workbenches (when nvcc is found). `make test` runs every CPU test. `make demo` runs the
# README's main job. See README.md.
#
#   make [all]          CPU library, tools and trainers (+ CUDA targets when nvcc exists)
#   make test           build and run all CPU tests (Catch2), print the suite summary
#   make demo           Debian deps (no npm), the CPU tools, then scripts/demo.sh: PreLN vs LDM
#                       (byte-level, tiny Shakespeare) side by side, ~10 minutes on 2 cores
#   make deps           install the Debian and npm dependencies (idempotent; root when missing)
#   make cuda           only the CUDA targets (needs nvcc)
#   make gpu-check-build what scripts/gpu_check.sh runs on a GPU machine (CUDA targets, CPU tools,
#                       GPU tests)
#   make clean
# Variables: CUDA_ARCH (default "90": sm_90 code + PTX), CUDA_PORTABLE_ARCH (default "80": PTX
# for any GPU from sm_80 on, so the binaries also run on Ampere/Ada), NVCC_THREADS (nvcc
# --threads, default 1), CXX, NVCC, OPT, DEBUG=1,
# V=1 (print every compiler command; default: one short "CXX file" line per file).

# this file (also under make -f PATH), for the rules that depend on it
THIS_MAKEFILE := $(lastword $(MAKEFILE_LIST))
CXX      ?= g++
NVCC     ?= $(shell command -v nvcc 2>/dev/null || (test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc))
OPT      ?= -O2 -march=native
ifeq ($(DEBUG),1)
OPT      := -O0 -g -fsanitize=address,undefined
endif
# -fno-math-errno -fno-trapping-math change no value (nothing reads errno or FP exception flags):
# they let g++ vectorise loops with sqrtf and with compare-and-clamp (exp_fast, AdamW).
CXXFLAGS += -std=c++17 $(OPT) -g -fopenmp -fno-math-errno -fno-trapping-math -Wall -Wextra -Wno-unused-parameter -I. -MMD -MP \
            -DLDM_SOURCE_DIR=\"$(CURDIR)\"
LDFLAGS  += -fopenmp $(filter -fsanitize=%,$(OPT))
LDLIBS   += -lpcre2-8 -lutf8proc -lopenblas -lbz2 -lpthread

# MPI (OpenMPI from scripts/install_deps.sh) for the data-parallel layer core/dist.cpp: include
# and library flags from the wrapper compiler (only -I / -L / -l, so nvcc accepts them too).
MPICXX    ?= mpicxx
MPI_CFLAGS := $(filter -I%,$(shell $(MPICXX) --showme:compile 2>/dev/null))
MPI_LIBS   := $(filter-out -lmpi_cxx,$(filter -L% -l%,$(shell $(MPICXX) --showme:link 2>/dev/null)))
CXXFLAGS += $(MPI_CFLAGS)
LDLIBS   += $(MPI_LIBS)

BUILD    ?= build

# Quiet build by default: "CXX core/eval.cpp" instead of the full command line; V=1 shows it.
ifeq ($(V),1)
Q :=
say = @true
else
Q := @
say = @printf '  %-6s %s\n' '$(1)' '$(2)'
endif

# Library: everything in core/, cpu/ and data/prep_*.cpp (no main() there).
LIB_SRCS := $(wildcard core/*.cpp) $(wildcard cpu/*.cpp) $(wildcard data/prep_*.cpp)
LIB_OBJS := $(LIB_SRCS:%.cpp=$(BUILD)/%.o)
LIB      := $(BUILD)/libldm.a

# Tools and trainers: one main() each.
TOOL_SRCS := $(wildcard data/ldm_*.cpp) $(wildcard train_*.cpp) $(wildcard eval_*.cpp) $(wildcard dev/bench_*.cpp) \
             $(wildcard generate_*.cpp)
TOOLS     := $(foreach s,$(TOOL_SRCS),$(BUILD)/$(basename $(notdir $(s))))

# Tests: each test/test_*.cpp is its own Catch2 binary (so one broken file does not stop the rest).
TEST_SRCS := $(wildcard test/test_*.cpp)
TESTS     := $(TEST_SRCS:test/%.cpp=$(BUILD)/test/%)
TEST_COMMON := $(BUILD)/test/catch_main.o $(BUILD)/test/helpers.o
# CPU-emulation tests of CUDA kernels (test/test_emu_*.cpp, rules below): only when the CUDA
# headers exist.
# The CUDA headers: beside the nvcc found (its realpath's ../include), else /usr/local/cuda.
CUDA_INC ?= $(firstword $(patsubst %/cuda_runtime.h,%,$(wildcard $(if $(NVCC),$(dir $(realpath $(NVCC)))../include/cuda_runtime.h) \
              /usr/local/cuda/include/cuda_runtime.h)) /usr/local/cuda/include)
# The GPU trainers built as host programs under the same emulation (build/emu/train_*, rules
# below): the emulated training-step tests run them like the real trainers.
EMU_PROGS := $(foreach s,$(wildcard train_*.cu),$(BUILD)/emu/$(basename $(s)))
ifeq ($(wildcard $(CUDA_INC)/cuda_runtime.h),)
TESTS := $(filter-out $(BUILD)/test/test_emu_%,$(TESTS))
EMU_PROGS :=
endif

# CUDA: trainers at the top level and the dev/cuda workbench, built only when nvcc exists (and,
# for `all` and `test`, NCCL's header with it: the CUDA toolkit does not always ship NCCL).
NCCL_H := $(firstword $(wildcard $(CUDA_INC)/nccl.h /usr/include/nccl.h))
BUILD_CUDA := $(if $(NVCC),$(if $(NCCL_H),yes))
CUDA_ARCH ?= 90
CUDA_PORTABLE_ARCH ?= 80
NVCC_OPT ?= -O3
# NVCC_THREADS: nvcc's --threads, how many of a file's compilation steps run at once (the two
# targets' cicc/ptxas passes); scripts/gpu_check.sh passes 2, where the longest file is the build's
# critical path on a many-core machine.
NVCC_THREADS ?= 1
NVCCFLAGS ?= $(NVCC_OPT) --threads $(NVCC_THREADS) -std=c++17 -lineinfo -I. -MMD -MP \
             -gencode arch=compute_$(CUDA_ARCH),code=sm_$(CUDA_ARCH) \
             -gencode arch=compute_$(CUDA_PORTABLE_ARCH),code=compute_$(CUDA_PORTABLE_ARCH) \
             --Werror all-warnings -Xcompiler -Wall,-Wextra,-Wno-unused-parameter,-Werror \
             -Xcompiler -fopenmp -DLDM_SOURCE_DIR=\"$(CURDIR)\"
# A change of compiler, flags or CPU rebuilds what they compiled: the objects of each compiler
# depend on a file $(BUILD)/.flags-NAME holding its command line, its version line and the CPU
# -march=native stands for (not nvcc's --threads, which changes no output), rewritten only when
# that text changes. A build directory made before these files existed gets them with an old
# date: it is taken as built with the current flags.
CXX_VERSION := $(shell $(CXX) --version 2>/dev/null | head -n 1)
NVCC_VERSION := $(if $(NVCC),$(shell $(NVCC) --version 2>/dev/null | tail -n 1))
# nvcc's host compiler: the g++ on PATH (unless NVCCFLAGS names another with -ccbin, in the text)
NVCC_HOST_VERSION := $(if $(NVCC),$(shell g++ --version 2>/dev/null | head -n 1))
NATIVE_ARCH := $(if $(findstring -march=native,$(CXXFLAGS)),$(shell $(CXX) -march=native -Q --help=target 2>/dev/null | awk '$$1 == "-march=" { print $$2; exit }'))
flags_differ = $(subst $(1),,$(2))$(subst $(2),,$(1))
flags_write = $(shell mkdir -p $(BUILD))$(file >$(1),$(2))
# flags_file(NAME,TEXT): a missing file is made with an old date; the top make rewrites one whose
# text differs (a sub-make does not: with CXXFLAGS from the environment it sees them appended
# twice, and rewriting would rebuild everything at each `make test`)
flags_path = $(BUILD)/.flags-$(1)
flags_file = $(if $(wildcard $(flags_path)),$(if $(filter 0,$(MAKELEVEL)),$(if $(call flags_differ,$(file <$(flags_path)),$(2)),$(call flags_write,$(flags_path),$(2)))),$(call flags_write,$(flags_path),$(2))$(shell touch -d @1 $(flags_path)))$(flags_path)
FLAGS_CXX := $(call flags_file,cxx,$(CXX) $(CXXFLAGS) native=$(NATIVE_ARCH) cuda_inc=$(CUDA_INC) version=$(CXX_VERSION))
FLAGS_NVCC := $(if $(NVCC),$(call flags_file,nvcc,$(NVCC) $(subst --threads $(NVCC_THREADS),,$(NVCCFLAGS)) version=$(NVCC_VERSION) host=$(NVCC_HOST_VERSION)))
# (after `make clean` in the same run the files are gone: then they count as remade)
$(BUILD)/.flags-%: ;
CUDA_LIBS ?= -lcublasLt -lcublas
CUDA_LIBS += -lnccl  # NCCL collectives (cuda/nccl.cuh); nccl.h beside the CUDA headers or in /usr/include
# nvcc links without -lpthread: glibc >= 2.34 has it in libc, and nvlink aborts ("elfLink
# internal error") on the stub libpthread.a of Ubuntu 24.04 (seen on the H200 image).
NVCC_LDLIBS = $(filter-out -lpthread,$(LDLIBS))
CU_SRCS  := $(wildcard train_*.cu) $(wildcard dev/cuda/*.cu)
CU_BINS  := $(foreach s,$(CU_SRCS),$(BUILD)/cuda/$(basename $(notdir $(s))))

.PHONY: all cpu cuda test demo deps clean tests
all: cpu $(if $(BUILD_CUDA),cuda)
cpu: $(LIB) $(TOOLS)
tests: $(TESTS) $(EMU_PROGS)

$(BUILD)/%.o: %.cpp $(FLAGS_CXX)
	@mkdir -p $(dir $@)
	$(call say,CXX,$<)
	$(Q)$(CXX) $(CXXFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	$(call say,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $^

define TOOL_RULE
$(BUILD)/$(basename $(notdir $(1))): $(BUILD)/$(basename $(1)).o $(LIB)
	$$(call say,LD,$$@)
	$(Q)$(CXX) $(LDFLAGS) $$^ $(LDLIBS) -o $$@
endef
$(foreach s,$(TOOL_SRCS),$(eval $(call TOOL_RULE,$(s))))

# Catch2's runner without debug info: with it, each of the ~45 test binaries carries ~10 MB of
# Catch2 DWARF (0.4 GiB of the suite's disk; a CI machine may have little to spare).
$(BUILD)/test/catch_main.o: CXXFLAGS += -g0

# The emulation tests export their kernels' symbols (-rdynamic), as the emulated trainers do
# (further below), so that $EMU_LAUNCH_LOG names the workbench kernels they launch (test_ptxas
# checks those launches). They depend on this Makefile, so that a build linked before that flag
# relinks. (Before the generic rule: older makes take the first pattern that matches.)
$(BUILD)/test/test_emu_%: $(BUILD)/test/test_emu_%.o $(TEST_COMMON) $(LIB) $(THIS_MAKEFILE)
	$(call say,LD,$@)
	$(Q)$(CXX) $(LDFLAGS) -rdynamic $(filter-out $(THIS_MAKEFILE),$^) $(LDLIBS) -o $@
$(BUILD)/test/%: $(BUILD)/test/%.o $(TEST_COMMON) $(LIB)
	$(call say,LD,$@)
	$(Q)$(CXX) $(LDFLAGS) $^ $(LDLIBS) -o $@

# CPU emulation of CUDA kernels (dev/emu, doc/cuda.md "Emulating kernels on the CPU"): the
# test/test_emu_*.cpp tests include host copies of cuda/*.cuh and of the dev/cuda workbenches
# that dev/emu/gen.py writes into $(BUILD)/emu/cuda_emu/, and compile with g++ against the CUDA headers only (no libcudart, no GPU).
# Without the CUDA headers these tests are left out of `tests`.
EMU_DIR  := $(BUILD)/emu
EMU_SRCS := $(wildcard cuda/*.cuh) $(wildcard dev/cuda/*.cu) $(wildcard dev/cuda/*.cuh) $(wildcard train_*.cu)
$(EMU_DIR)/.stamp: dev/emu/gen.py $(EMU_SRCS)
	@mkdir -p $(EMU_DIR)
	$(call say,GEN,$(EMU_DIR))
	$(Q)python3 dev/emu/gen.py -q --out $(EMU_DIR) $(EMU_SRCS)
	@touch $@
EMU_CXXFLAGS = $(CXXFLAGS) -I$(EMU_DIR) -isystem $(CUDA_INC) -Wno-unknown-pragmas -fno-strict-aliasing
$(EMU_PROGS:%=%.o): $(BUILD)/emu/%.o: dev/emu/program.cpp $(EMU_DIR)/.stamp $(wildcard dev/emu/*.h) $(FLAGS_CXX)
	$(call say,CXX,$*.cu (emulated))
	$(Q)$(CXX) $(EMU_CXXFLAGS) -DEMU_PROGRAM='"cuda_emu/$*.cu.h"' -c $< -o $@
# -rdynamic: kernels keep their symbols in the dynamic table, so that $EMU_LAUNCH_LOG names them
# (dladdr; scripts/launch_check.py joins the log with ptxas's registers per kernel).
$(EMU_PROGS): $(BUILD)/emu/%: $(BUILD)/emu/%.o $(LIB)
	$(call say,LD,$@)
	$(Q)$(CXX) $(LDFLAGS) -rdynamic $^ $(LDLIBS) -o $@
$(BUILD)/test/test_emu_%.o: test/test_emu_%.cpp $(EMU_DIR)/.stamp $(wildcard dev/emu/*.h) $(FLAGS_CXX)
	@mkdir -p $(dir $@)
	$(call say,CXX,$<)
	$(Q)$(CXX) $(EMU_CXXFLAGS) -c $< -o $@

# Race detection (doc/cuda.md "Emulating kernels on the CPU", "Race detection"): the kernel-level
# emulation tests built again with ThreadSanitizer into $(BUILD)/tsan (every emulated thread a
# fiber, the barriers CUDA defines the only order between them), plus test/tsan_emu_race.cpp (the
# detector's own checks). Left out, with a note, where g++ cannot build -fsanitize=thread.
TSAN_DIR   := $(BUILD)/tsan
# (the longest first, ~130 s down to ~40 s for the first five on 2 cores: scripts/run_tests.sh runs
# them LDM_TEST_JOBS at a time)
TSAN_NAMES := hc ldm attnres attention adamw classifier gpt_infer infer swiglu embedding graph matmul preln \
              rmsnorm rope
TSAN_OK    := $(if $(EMU_PROGS),$(shell echo 'int main(){}' | $(CXX) -x c++ -fsanitize=thread - -o /dev/null 2>/dev/null && echo yes))
TSAN_TESTS := $(if $(TSAN_OK),$(TSAN_NAMES:%=$(TSAN_DIR)/test_emu_%) $(TSAN_DIR)/tsan_emu_race)
TSAN_CXXFLAGS = $(filter-out -O% -march=% -fsanitize=%,$(EMU_CXXFLAGS)) -O1 -fsanitize=thread
TSAN_LINK = $(CXX) $(filter-out -fsanitize=%,$(LDFLAGS)) -fsanitize=thread $^ $(LDLIBS) -o $@
tests: $(TSAN_TESTS)
$(TSAN_DIR)/%.o: test/%.cpp $(EMU_DIR)/.stamp $(wildcard dev/emu/*.h) $(FLAGS_CXX)
	@mkdir -p $(dir $@)
	$(call say,CXX,$< (ThreadSanitizer))
	$(Q)$(CXX) $(TSAN_CXXFLAGS) -c $< -o $@
# The emulated trainers under ThreadSanitizer (by hand, not part of `make test`: ~20x slower than
# build/emu/train_*): make tsan-trainers, then run build/tsan/train_* like build/emu/train_*.
TSAN_PROGS := $(EMU_PROGS:$(BUILD)/emu/%=$(TSAN_DIR)/%)
.PHONY: tsan-trainers
tsan-trainers: $(TSAN_PROGS)
$(TSAN_PROGS:%=%.o): $(TSAN_DIR)/%.o: dev/emu/program.cpp $(EMU_DIR)/.stamp $(wildcard dev/emu/*.h) $(FLAGS_CXX)
	@mkdir -p $(dir $@)
	$(call say,CXX,$*.cu (emulated, ThreadSanitizer))
	$(Q)$(CXX) $(TSAN_CXXFLAGS) -DEMU_PROGRAM='"cuda_emu/$*.cu.h"' -c $< -o $@
$(TSAN_PROGS): $(TSAN_DIR)/%: $(TSAN_DIR)/%.o $(LIB)
	$(call say,LD,$@)
	$(Q)$(TSAN_LINK)
$(TSAN_DIR)/%: $(TSAN_DIR)/%.o $(TEST_COMMON) $(LIB)
	$(call say,LD,$@)
	$(Q)$(TSAN_LINK)

# wgmma (dev/cuda/wgmma.cuh, the attention workbench's wgmma variant) exists only on the
# arch-specific target sm_90a: the attention workbench's CUDA_ARCH=90 cubin is built as sm_90a
# (the same H100/H200 run it; the compute_80 PTX stays portable and traps in the wgmma kernel,
# which the workbench runs only on compute capability 9.0).
comma := ,
WGMMA_BINS := $(BUILD)/cuda/attention
$(WGMMA_BINS:%=%.o): NVCCFLAGS := $(subst arch=compute_90$(comma)code=sm_90 ,arch=compute_90a$(comma)code=sm_90a ,$(NVCCFLAGS))
# Each CUDA target is compiled (nvcc -c, which needs no library: the first, train_gpt_baselines, the
# longest, starts before libldm.a is built under make -j) and then linked against $(LIB). The compile keeps ptxas's resource report
# (-Xptxas -v: registers, shared memory, spills per kernel of the CUDA_ARCH cubin) in
# $(BUILD)/cuda/NAME.ptxas, which test_ptxas and scripts/ptxas_report.py --log read instead of
# compiling again; everything else nvcc prints still reaches the terminal.
cuda: $(CU_BINS)
define nvcc_compile
	@mkdir -p $(dir $@)
	$(call say,NVCC,$<)
	$(Q)$(NVCC) $(NVCCFLAGS) -Xptxas -v -c $< -o $@ 2> $(@:.o=.ptxas).tmp; \
	  st=$$?; grep -v -E '^ptxas info +:|^ +[0-9]+ bytes stack frame' $(@:.o=.ptxas).tmp >&2; \
	  if [ $$st = 0 ]; then mv -f $(@:.o=.ptxas).tmp $(@:.o=.ptxas); else rm -f $(@:.o=.ptxas).tmp $(@:.o=.ptxas); fi; exit $$st
endef
$(BUILD)/cuda/%.o: %.cu $(FLAGS_NVCC)
	$(nvcc_compile)
$(BUILD)/cuda/%.o: dev/cuda/%.cu $(FLAGS_NVCC)
	$(nvcc_compile)
$(CU_BINS): $(BUILD)/cuda/%: $(BUILD)/cuda/%.o $(LIB)
	$(call say,NVLD,$@)
	$(Q)$(NVCC) $(filter-out -MMD -MP,$(NVCCFLAGS)) $< $(LIB) $(CUDA_LIBS) $(NVCC_LDLIBS) -lgomp -o $@

# What scripts/gpu_check.sh needs on the GPU machine: the CUDA programs first (make goes depth
# first, so train_gpt_baselines.o, the longest compile, starts at once, the library's objects
# next, then the other CUDA objects), the CPU tools and library the GPU tests run, the GPU tests and
# test_dist (its [gpu] case). Not the CPU, emulation or ThreadSanitizer tests, which need no
# GPU and are most of `tests`' compile units.
GPU_TESTS := $(filter $(BUILD)/test/test_gpu_%,$(TESTS)) $(BUILD)/test/test_dist
.PHONY: gpu-check-build
gpu-check-build: $(if $(BUILD_CUDA),cuda) cpu $(GPU_TESTS)

deps:
	@bash scripts/install_deps.sh

# The test command of the README. Builds everything the tests exercise, then runs every test
# binary and prints "tests: N passed, N failed". The tests need the npm packages too (the
# tokenizer cross-check against independent JavaScript encoders, test/js).
test: deps
	@$(MAKE) --no-print-directory -j$(shell nproc) cpu tests $(if $(BUILD_CUDA),cuda)
	@$(MAKE) --no-print-directory run-tests

# The order of the run: the emulation and ThreadSanitizer tests last, as one pool of one-thread
# binaries (scripts/run_tests.sh runs them LDM_TEST_JOBS at a time), the longest first:
# test_emu_train (~150 s on 2 cores), the ThreadSanitizer ones (~130 s down), the other test_emu_*.
EMU_TESTS := $(filter $(BUILD)/test/test_emu_%,$(TESTS))
RUN_ORDER := $(filter-out $(EMU_TESTS),$(TESTS)) $(filter %/test_emu_train,$(EMU_TESTS)) $(TSAN_TESTS) \
             $(filter-out %/test_emu_train,$(EMU_TESTS))
# Runs the built tests. A make of its own, so that its lists see what `deps` installed (g++'s
# ThreadSanitizer runtime on a fresh machine); what is left out, and why, is said first.
.PHONY: run-tests
run-tests:
	@$(if $(EMU_PROGS),,echo "note: no CUDA headers ($(CUDA_INC)/cuda_runtime.h): the CPU-emulation tests of the CUDA kernels and trainers (test_emu_*) and the race-detection tests are left out")
	@$(if $(NVCC),$(if $(NCCL_H),,echo "note: $(NVCC) has no NCCL (nccl.h not in $(CUDA_INC) or /usr/include): the CUDA trainers and workbenches are not built (install NCCL, e.g. libnccl-dev)"))
	@$(if $(EMU_PROGS),$(if $(TSAN_OK),,echo "note: $(CXX) cannot build -fsanitize=thread: the race-detection tests ($(TSAN_DIR)) are left out"))
	@bash scripts/run_tests.sh $(RUN_ORDER)

# The demo needs no network: Debian packages only (no npm), the CPU tools, the local data. Its
# output (build time included) goes to demo_out/ (git-ignored); DEMO_* variables: scripts/demo.sh.
demo:
	@bash scripts/install_deps.sh --no-npm
	@bash scripts/demo.sh --build

clean:
	rm -rf $(BUILD)

.SECONDARY:
-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
