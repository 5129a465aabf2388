# moegen — the one build. `make` builds build/moegen and build/libmoegen.a;
# `make run` emits and compiles the default example; `make test` runs the
# CPU tests (and the GPU tests, which skip without a GPU); `make
# test-sanitize` the CPU tests under ASan + UBSan (build-san/).

# ---- settings ------------------------------------------------------------
CUDA_HOME ?= /usr/local/cuda
CC        ?= gcc
CFLAGS    ?= -O2 -g
NVCC      ?= $(CUDA_HOME)/bin/nvcc
MULTIARCH := $(shell $(CC) -print-multiarch 2>/dev/null)
LUA_INC   ?= /usr/include/lua5.4
LUA_LIB   ?= /usr/lib/$(or $(MULTIARCH),x86_64-linux-gnu)/liblua5.4.a
XXHASH_H  ?= /usr/include/xxhash.h
# jansson (the compiled folder's manifest.json is read with it): linked
# statically as Lua is; the shared library links the system's .so
JANSSON_H   ?= /usr/include/jansson.h
JANSSON_LIB ?= /usr/lib/$(or $(MULTIARCH),x86_64-linux-gnu)/libjansson.a
DEB_PKGS  := liblua5.4-dev libxxhash-dev libjansson-dev
SPEC      ?= examples/specs/mixtral-8x7b.moe
BUILD     := build

WARN      := -std=c11 -Wall -Wextra -Wno-format-truncation -Werror=implicit-function-declaration
CPPFLAGS  := -Igen -Iruntime -I$(LUA_INC) -I$(CUDA_HOME)/include
LDLIBS    := $(LUA_LIB) $(JANSSON_LIB) -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -ldl -lm -lpthread

GEN_SRC   := gen/spec.c gen/spec_check.c gen/spec_schema.c gen/sandbox.c gen/util.c gen/template.c gen/plan.c gen/mesh.c gen/emit.c gen/compile.c gen/cache.c gen/ep_plan.c gen/tuning.c \
             gen/family.c gen/family_route.c gen/family_permute.c gen/family_gemm.c gen/family_combine.c \
             gen/family_ep.c gen/family_swiglu.c gen/family_pack.c gen/family_bwd.c gen/family_bgemm.c
TUNING    := tuning/h200.tune
TEMPLATES := $(sort $(wildcard templates/*.lua))
SPECS     := $(sort $(wildcard examples/specs/*.moe))
RT_SRC    := runtime/moe_error.c runtime/bgemm.c runtime/abi.c runtime/moe_plan.c runtime/launch.c runtime/ffn.c runtime/moe_forward.c runtime/cudnn_load.c runtime/cudnn_graph.c runtime/cudnn_policy.c runtime/cudnn_check.c runtime/driver.c runtime/half.c runtime/fp8.c runtime/nccl_dl.c runtime/ep.c runtime/ep_bwd.c runtime/pack.c runtime/pack_fp8.c runtime/backward.c runtime/fsdp_grad.c
GEN_OBJ   := $(GEN_SRC:%.c=$(BUILD)/%.o) $(BUILD)/templates_embed.o $(BUILD)/tuning_embed.o $(BUILD)/launch_geom_embed.o
RT_OBJ    := $(RT_SRC:%.c=$(BUILD)/%.o)
# Test support, not shipped: the CPU reference and the CPU dispatch model,
# linked by the tests, the benchmark and the examples that check results.
TEST_SRC  := tests/support/ref.c tests/support/dispatch.c
TEST_OBJ  := $(TEST_SRC:%.c=$(BUILD)/%.o)
TEST_LIB  := $(BUILD)/libmoegen_test.a

.PHONY: all run test kernels clean
# everything: the command, the libraries, the benchmark and the examples
all: $(BUILD)/moegen $(BUILD)/libmoegen.a $(BUILD)/libmoegen.so $(BUILD)/moegen.pc \
     $(BUILD)/moe_bench $(BUILD)/moe_example $(BUILD)/moe_ep_example

# ---- what the build needs from the system -------------------------------
# `make deps` checks for Lua 5.4 (headers and static library), xxhash's
# header and jansson (header and static library); missing ones are installed with apt-get when run as root, else it
# prints the command and fails. Every compile waits for it, so `make run`
# and `make test` on a fresh machine set it up first (.ci/run does the same).
.PHONY: deps
deps:
	@missing=; [ -f $(LUA_INC)/lua.h ] && [ -f $(LUA_LIB) ] || missing=liblua5.4-dev; \
	[ -f $(XXHASH_H) ] || missing="$$missing libxxhash-dev"; \
	[ -f $(JANSSON_H) ] && [ -f $(JANSSON_LIB) ] || missing="$$missing libjansson-dev"; \
	[ -z "$$missing" ] && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "make deps: installing $$missing (apt-get)"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; } || exit 1; \
	else \
	    echo "make deps: missing $$missing (Lua 5.4 at $(LUA_INC), $(LUA_LIB); $(XXHASH_H); $(JANSSON_H), $(JANSSON_LIB))." >&2; \
	    echo "make deps: install them with: sudo apt-get install $$missing" >&2; exit 1; \
	fi

# the system's libraries, named as prerequisites: deps installs them (make -j waits for it)
$(LUA_LIB) $(JANSSON_LIB): | deps

$(BUILD)/%.o: %.c $(wildcard gen/*.h runtime/*.h cli/*.h tests/support/*.h) | deps
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(CPPFLAGS) -c $< -o $@

# Layers point down: cli/ (the moegen command) uses gen/ and runtime/;
# runtime/ uses gen/'s plan; gen/ sees no runtime header (its objects
# compile without -Iruntime, and `make layers` says which include broke it).
$(BUILD)/gen/%.o: CPPFLAGS := $(filter-out -Iruntime,$(CPPFLAGS))

# ---- generated files -----------------------------------------------------
$(BUILD)/embed: gen/embed.c
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS) $< -o $@

$(BUILD)/templates_embed.c: $(BUILD)/embed $(TEMPLATES)
	$(BUILD)/embed $@ moe_embedded_templates $(TEMPLATES)

$(BUILD)/templates_embed.o: $(BUILD)/templates_embed.c gen/template.h | deps
	$(CC) $(CFLAGS) $(CPPFLAGS) -Igen -c $< -o $@

# the tuning table, embedded the same way under the symbol moe_embedded_tuning
$(BUILD)/tuning_embed.c: $(BUILD)/embed $(TUNING)
	$(BUILD)/embed $@ moe_embedded_tuning $(TUNING)

$(BUILD)/tuning_embed.o: $(BUILD)/tuning_embed.c gen/template.h | deps
	$(CC) $(CFLAGS) $(CPPFLAGS) -Igen -c $< -o $@

# the launch geometry and packed-layout headers, which emission pastes into every emitted .cu
$(BUILD)/launch_geom_embed.c: $(BUILD)/embed gen/launch_geom.h gen/pack_geom.h
	$(BUILD)/embed $@ moe_embedded_launch_geom gen/launch_geom.h gen/pack_geom.h

$(BUILD)/launch_geom_embed.o: $(BUILD)/launch_geom_embed.c gen/template.h | deps
	$(CC) $(CFLAGS) $(CPPFLAGS) -Igen -c $< -o $@

# ---- the library and the command -----------------------------------------
$(BUILD)/libmoegen.a: $(GEN_OBJ) $(RT_OBJ)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/moegen: $(BUILD)/cli/main.o $(BUILD)/cli/tune.o $(BUILD)/libmoegen.a
	$(CC) $(CFLAGS) $^ $(LDLIBS) -o $@

# kernels_out/ holds the emitted sources of every example spec (committed).
kernels: $(BUILD)/moegen
	@for s in $(SPECS); do n=$$(basename $$s .moe); \
	  echo "emit $$s -> kernels_out/$$n"; $(BUILD)/moegen emit $$s -o kernels_out/$$n || exit 1; done

run: all
	$(BUILD)/moegen compile $(SPEC) -o $(BUILD)/run/$$(basename $(SPEC) .moe)
	@ls -l $(BUILD)/run/$$(basename $(SPEC) .moe)

clean:
	rm -rf $(BUILD)

# ---- install ---------------------------------------------------------------
# `make install [PREFIX=/usr/local] [DESTDIR=]`: the command, the public
# header (PREFIX/include/moegen/moe.h), the static library, the shared
# library (libmoegen.so.VERSION, SONAME libmoegen.so.SOVERSION, and the
# links), a pkg-config file for that prefix, a CMake package
# (lib/cmake/moegen: find_package(moegen) gives moegen::moegen, the shared
# library, and moegen::moegen_static), and share/moegen (the templates, for
# --templates copies; the example specs and programs). The shared library needs
# the system's liblua5.4.so.0 (Debian: liblua5.4-0, which liblua5.4-dev
# brings) and libjansson.so.4 (libjansson4, which libjansson-dev brings); NVRTC is
# loaded with dlopen when a JIT plan first needs it, found through the rpath
# ($(CUDA_HOME)/lib64) or the system's search.
PREFIX  ?= /usr/local
DESTDIR ?=
.PHONY: install
install: $(BUILD)/moegen $(BUILD)/libmoegen.a $(BUILD)/libmoegen.so
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/include/moegen $(DESTDIR)$(PREFIX)/lib/pkgconfig \
	  $(DESTDIR)$(PREFIX)/lib/cmake/moegen $(DESTDIR)$(PREFIX)/share/moegen/templates \
	  $(DESTDIR)$(PREFIX)/share/moegen/examples/specs
	install -m 755 $(BUILD)/moegen $(DESTDIR)$(PREFIX)/bin/moegen
	install -m 644 runtime/moe.h $(DESTDIR)$(PREFIX)/include/moegen/moe.h
	install -m 644 $(BUILD)/libmoegen.a $(DESTDIR)$(PREFIX)/lib/libmoegen.a
	install -m 755 $(BUILD)/libmoegen.so $(DESTDIR)$(PREFIX)/lib/libmoegen.so.$(VERSION)
	ln -sf libmoegen.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/libmoegen.so.$(SOVERSION)
	ln -sf libmoegen.so.$(SOVERSION) $(DESTDIR)$(PREFIX)/lib/libmoegen.so
	printf 'prefix=%s\nlibdir=$${prefix}/lib\nincludedir=$${prefix}/include\n\nName: moegen\nDescription: MoE layer code generator and runtime\nVersion: $(VERSION)\nCflags: -I$${includedir}/moegen\nLibs: -L$${libdir} -lmoegen\nLibs.private: $(LDLIBS)\n' \
	  "$(PREFIX)" > $(DESTDIR)$(PREFIX)/lib/pkgconfig/moegen.pc
	sed $(CMAKE_SUBST) cmake/moegenConfig.cmake.in > $(DESTDIR)$(PREFIX)/lib/cmake/moegen/moegenConfig.cmake
	sed $(CMAKE_SUBST) cmake/moegenConfigVersion.cmake.in > $(DESTDIR)$(PREFIX)/lib/cmake/moegen/moegenConfigVersion.cmake
	install -m 644 $(TEMPLATES) $(DESTDIR)$(PREFIX)/share/moegen/templates
	install -m 644 $(SPECS) $(DESTDIR)$(PREFIX)/share/moegen/examples/specs
	install -m 644 examples/*.c $(DESTDIR)$(PREFIX)/share/moegen/examples

# The CMake package's placeholders (cmake/*.cmake.in): the version, the
# SONAME's number, and the static library's link line as a CMake list.
CMAKE_SUBST = -e 's|@VERSION@|$(VERSION)|g' -e 's|@SOVERSION@|$(SOVERSION)|g' \
  -e 's|@VERSION_MAJOR@|$(word 1,$(subst ., ,$(VERSION)))|g' -e 's|@VERSION_MINOR@|$(word 2,$(subst ., ,$(VERSION)))|g' \
  -e 's|@STATIC_LIBS@|$(subst $(SPACE),;,$(strip $(LDLIBS)))|g'
EMPTY :=
SPACE := $(EMPTY) $(EMPTY)

# ---- tests ---------------------------------------------------------------
# Each tests/test_*.c is its own program printing "N passed, N failed";
# tests/run.sh runs them and prints the total as the closing line.
CPU_TESTS := test_spec test_abi test_mesh test_plan test_ref test_quant test_emit test_write test_sandbox test_cache test_nvrtc test_runtime test_dispatch test_tuning test_gemv_host test_bwd_host test_scatter_host test_route_host test_python test_pack test_install test_nccl_abi
GPU_TESTS := test_gpu test_ep_gpu test_bgemm_gpu test_bwd_gpu test_quant_gpu
TEST_BINS := $(addprefix $(BUILD)/tests/,$(CPU_TESTS) $(GPU_TESTS) test_mgpu)

# The Python package's CPU tests (python/tests/run.py) against this build's
# libmoegen.so, as a program run.sh runs; skipped when there is no python3.
# A sanitized build (make test-sanitize) preloads libasan into the
# interpreter, which is not built with it, with leak checks off: Python
# leaves objects unfreed at exit, and the C tests hold the library's leaks.
TEST_PYTHON_ENV = $(if $(filter -fsanitize=%,$(CFLAGS)),LD_PRELOAD=$(shell $(CC) -print-file-name=libasan.so) \
                  ASAN_OPTIONS=$${ASAN_OPTIONS}:detect_leaks=0)
$(BUILD)/tests/test_python: python/tests/run.py $(BUILD)/libmoegen.so
	@mkdir -p $(dir $@)
	@printf '#!/bin/sh\ncommand -v python3 >/dev/null || { echo "test_python: 0 passed, 0 failed, 1 skipped"; exit 0; }\nMOEGEN_LIBRARY=%s %s exec python3 python/tests/run.py\n' "$(abspath $(BUILD))/libmoegen.so" '$(TEST_PYTHON_ENV)' > $@
	@chmod +x $@

# `make install` into a temporary DESTDIR, used as a program would use it
# (tests/test_install.sh), as a program run.sh runs.
$(BUILD)/tests/test_install: tests/test_install.sh $(BUILD)/moegen $(BUILD)/libmoegen.a $(BUILD)/libmoegen.so $(BUILD)/moegen.pc \
  cmake/moegenConfig.cmake.in cmake/moegenConfigVersion.cmake.in
	@mkdir -p $(dir $@)
	@cp tests/test_install.sh $@ && chmod +x $@

# <nccl.h> is optional (runtime/nccl_dl.h declares what libmoegen uses when
# it is absent): the EP runtime also builds without it (MOE_NO_NCCL_HEADERS),
# and those declarations are held to the header where there is one.
$(BUILD)/tests/test_nccl_abi: tests/test_nccl_abi.c tests/support/nccl_own.c runtime/nccl_dl.h runtime/ep.c runtime/ep.h \
  runtime/nccl_dl.c runtime/fsdp_grad.c runtime/fsdp_grad.h tests/check.h | deps
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(CPPFLAGS) -DMOE_NO_NCCL_HEADERS -fsyntax-only runtime/ep.c
	$(CC) $(WARN) $(CFLAGS) $(CPPFLAGS) -DMOE_NO_NCCL_HEADERS -fsyntax-only runtime/nccl_dl.c
	$(CC) $(WARN) $(CFLAGS) $(CPPFLAGS) -DMOE_NO_NCCL_HEADERS -fsyntax-only runtime/fsdp_grad.c
	$(CC) $(WARN) $(CFLAGS) $(CPPFLAGS) -DMOE_NO_NCCL_HEADERS -c tests/support/nccl_own.c -o $(BUILD)/tests/nccl_own.o
	$(CC) $(WARN) $(CFLAGS) $(CPPFLAGS) -Itests $< $(BUILD)/tests/nccl_own.o -o $@

$(TEST_LIB): $(TEST_OBJ)
	rm -f $@ && ar rcs $@ $^

# test_tuning also checks moegen tune's winner rule (cli/tune.o)
TEST_EXTRA_test_tuning := $(BUILD)/cli/tune.o
$(BUILD)/tests/test_tuning: $(BUILD)/cli/tune.o cli/tune.h

$(BUILD)/tests/%: tests/%.c tests/check.h tests/mesh_fixture.h tests/ep_data.h tests/gen_fixture.h $(wildcard gen/*.h runtime/*.h tests/support/*.h) $(TEST_LIB) $(BUILD)/libmoegen.a
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(CPPFLAGS) -Itests -Itests/support -Icli -DMOEGEN_BUILD='"$(BUILD)"' $< $(TEST_EXTRA_$(notdir $@)) \
	  $(TEST_LIB) $(BUILD)/libmoegen.a $(LDLIBS) -o $@

.PHONY: test test-cpu test-gpu test-mgpu layers
test: layers $(TEST_BINS) $(BUILD)/moegen
	@bash tests/run.sh $(BUILD) $(CPU_TESTS) $(GPU_TESTS)

test-cpu: layers $(addprefix $(BUILD)/tests/,$(CPU_TESTS)) $(BUILD)/moegen
	@bash tests/run.sh $(BUILD) $(CPU_TESTS)

test-gpu: $(addprefix $(BUILD)/tests/,$(GPU_TESTS))
	@bash tests/run.sh $(BUILD) $(GPU_TESTS)

# The generator includes no header of the runtime or the command.
layers:
	@bad=$$(for h in runtime/*.h cli/*.h; do grep -ln "#include \"$$(basename $$h)\"" gen/*.[ch]; done | sort -u); \
	if [ -n "$$bad" ]; then echo "layers: gen/ includes a runtime/ or cli/ header: $$bad" >&2; exit 1; fi

# One process per GPU over NCCL (libnccl.so.2 on LD_LIBRARY_PATH); meshes
# needing more GPUs than the machine has are reported skipped.
test-mgpu: $(BUILD)/tests/test_mgpu
	NCCL_NVLS_ENABLE=0 $(BUILD)/tests/test_mgpu

# The vendored path: an emitted .cu built by plain nvcc with no libmoegen.
VENDORED_SPEC := qwen3-30b-a3b
VENDORED_NAME := qwen3_30b_a3b
# a spec with a shared expert: test_vendored packs it (NAME_pack_shared)
VENDORED_DEFS := $(shell grep -q '^shared' examples/specs/$(VENDORED_SPEC).moe 2>/dev/null && echo -DVENDORED_SHARED)
VENDORED_OBJ := $(BUILD)/tests/support/ref.o $(BUILD)/runtime/half.o $(BUILD)/runtime/fp8.o $(BUILD)/gen/spec.o $(BUILD)/gen/spec_check.o $(BUILD)/gen/spec_schema.o $(BUILD)/gen/sandbox.o $(BUILD)/gen/util.o
VENDORED_SM90 := -gencode=arch=compute_90a,code=sm_90a
VENDORED_BOTH := $(VENDORED_SM90) -gencode=arch=compute_80,code=sm_80
# test_vendored.cu built against one emitted spec by plain nvcc:
# $(call vendored_build,GENCODES,EMITTED_CU,NAME,DEFINES)
define vendored_build
mkdir -p $(dir $@)
$(NVCC) -O2 -std=c++17 $(1) -Igen -Iruntime -Itests -Itests/support -I$(dir $(2)) -I$(LUA_INC) \
  -DVENDORED_NAME=$(3) -DVENDORED_HEADER=$(3).h $(4) tests/test_vendored.cu $(2) $(VENDORED_OBJ) $(LUA_LIB) -o $@
endef
$(BUILD)/tests/test_vendored: tests/test_vendored.cu kernels_out/$(VENDORED_SPEC)/$(VENDORED_NAME).cu $(VENDORED_OBJ)
	$(call vendored_build,$(VENDORED_BOTH),kernels_out/$(VENDORED_SPEC)/$(VENDORED_NAME).cu,$(VENDORED_NAME),$(VENDORED_DEFS))

# The same test over the split-K GEMMs: the spec emitted under tests/tune/splitk.tune
# (its GEMMs on the splitkS grid at every size) into build/, built the same way.
VENDORED_SPLITK := $(BUILD)/vendored_splitk/$(VENDORED_NAME).cu
$(VENDORED_SPLITK): $(BUILD)/moegen tests/tune/splitk.tune examples/specs/$(VENDORED_SPEC).moe
	$(BUILD)/moegen emit examples/specs/$(VENDORED_SPEC).moe --tuning tests/tune/splitk.tune -o $(dir $@)
$(BUILD)/tests/test_vendored_splitk: tests/test_vendored.cu $(VENDORED_SPLITK) $(VENDORED_OBJ)
	$(call vendored_build,$(VENDORED_BOTH),$(VENDORED_SPLITK),$(VENDORED_NAME),$(VENDORED_DEFS))

# And over the CTA pairs ("+mc"): the spec emitted under tests/tune/pairs.tune (persist
# and ping-pong grids in 2-CTA clusters; the launcher sizes their grids by resident pairs).
VENDORED_PAIRS := $(BUILD)/vendored_pairs/$(VENDORED_NAME).cu
$(VENDORED_PAIRS): $(BUILD)/moegen tests/tune/pairs.tune examples/specs/$(VENDORED_SPEC).moe
	$(BUILD)/moegen emit examples/specs/$(VENDORED_SPEC).moe --tuning tests/tune/pairs.tune -o $(dir $@)
$(BUILD)/tests/test_vendored_pairs: tests/test_vendored.cu $(VENDORED_PAIRS) $(VENDORED_OBJ)
	$(call vendored_build,$(VENDORED_BOTH),$(VENDORED_PAIRS),$(VENDORED_NAME),$(VENDORED_DEFS))

# And over the gemv GEMMs: the spec emitted under tests/tune/gemv.tune (both
# GEMMs on the gemv grid at every size, launched on the 2D grid).
VENDORED_GEMV := $(BUILD)/vendored_gemv/$(VENDORED_NAME).cu
$(VENDORED_GEMV): $(BUILD)/moegen tests/tune/gemv.tune examples/specs/$(VENDORED_SPEC).moe
	$(BUILD)/moegen emit examples/specs/$(VENDORED_SPEC).moe --tuning tests/tune/gemv.tune -o $(dir $@)
$(BUILD)/tests/test_vendored_gemv: tests/test_vendored.cu $(VENDORED_GEMV) $(VENDORED_OBJ)
	$(call vendored_build,$(VENDORED_BOTH),$(VENDORED_GEMV),$(VENDORED_NAME),$(VENDORED_DEFS))

# And over the chain (tests/tune/chain.tune: the up GEMM's grid runs the down
# GEMM and the combine at 1..47 tokens, a cooperative launch; past them ping-pong).
VENDORED_CHAIN := $(BUILD)/vendored_chain/$(VENDORED_NAME).cu
$(VENDORED_CHAIN): $(BUILD)/moegen tests/tune/chain.tune examples/specs/$(VENDORED_SPEC).moe
	$(BUILD)/moegen emit examples/specs/$(VENDORED_SPEC).moe --tuning tests/tune/chain.tune -o $(dir $@)
$(BUILD)/tests/test_vendored_chain: tests/test_vendored.cu $(VENDORED_CHAIN) $(VENDORED_OBJ)
	$(call vendored_build,$(VENDORED_BOTH),$(VENDORED_CHAIN),$(VENDORED_NAME),$(VENDORED_DEFS))

# The vendored fp8 path: an fp8 spec (examples/specs/fp8/, which kernels/
# does not hold) emitted into build/ and built as test_vendored with
# VENDORED_FP8: NAME_quantize, NAME_pack_fp8 and the fp8 NAME_forward.
VENDORED_FP8_SPEC := qwen3-30b-a3b-fp8
VENDORED_FP8_NAME := qwen3_30b_a3b_fp8
VENDORED_FP8_DIR := $(BUILD)/vendored/$(VENDORED_FP8_SPEC)
$(VENDORED_FP8_DIR)/$(VENDORED_FP8_NAME).cu: examples/specs/fp8/$(VENDORED_FP8_SPEC).moe $(BUILD)/moegen
	$(BUILD)/moegen emit $< -o $(VENDORED_FP8_DIR)
$(BUILD)/tests/test_vendored_fp8: tests/test_vendored.cu $(VENDORED_FP8_DIR)/$(VENDORED_FP8_NAME).cu $(VENDORED_OBJ)
	$(call vendored_build,$(VENDORED_SM90),$(VENDORED_FP8_DIR)/$(VENDORED_FP8_NAME).cu,$(VENDORED_FP8_NAME),-DVENDORED_FP8)
# And the fp8 spec's GEMMs on the gemv grid (tests/tune/gemv8.tune: its fp8
# code, the up GEMM's clusters, the folded combine at small calls).
VENDORED_FP8G_DIR := $(BUILD)/vendored_gemv8/$(VENDORED_FP8_SPEC)
$(VENDORED_FP8G_DIR)/$(VENDORED_FP8_NAME).cu: examples/specs/fp8/$(VENDORED_FP8_SPEC).moe $(BUILD)/moegen tests/tune/gemv8.tune
	$(BUILD)/moegen emit $< --tuning tests/tune/gemv8.tune -o $(VENDORED_FP8G_DIR)
$(BUILD)/tests/test_vendored_fp8_gemv: tests/test_vendored.cu $(VENDORED_FP8G_DIR)/$(VENDORED_FP8_NAME).cu $(VENDORED_OBJ)
	$(call vendored_build,$(VENDORED_SM90),$(VENDORED_FP8G_DIR)/$(VENDORED_FP8_NAME).cu,$(VENDORED_FP8_NAME),-DVENDORED_FP8)

# The vendored path with given routing: the caller's ids and weights
# (tests/specs/given_weights.moe, fp16, biases), NAME_BAD_IDS_AT's count.
VENDORED_GIVEN_DIR := $(BUILD)/vendored_given
$(VENDORED_GIVEN_DIR)/given_weights.cu: tests/specs/given_weights.moe $(BUILD)/moegen
	$(BUILD)/moegen emit $< -o $(VENDORED_GIVEN_DIR)
$(BUILD)/tests/test_vendored_given: tests/test_vendored.cu $(VENDORED_GIVEN_DIR)/given_weights.cu $(VENDORED_OBJ)
	$(call vendored_build,$(VENDORED_BOTH),$(VENDORED_GIVEN_DIR)/given_weights.cu,given_weights,-DVENDORED_GIVEN -DVENDORED_GIVEN_W)

# The vendored path with the router's own input and per-expert scales
# (tests/specs/router_own_input.moe: Gemma 4's router; GeGLU experts).
VENDORED_OWN_DIR := $(BUILD)/vendored_own
$(VENDORED_OWN_DIR)/router_own_input.cu: tests/specs/router_own_input.moe $(BUILD)/moegen
	$(BUILD)/moegen emit $< -o $(VENDORED_OWN_DIR)
$(BUILD)/tests/test_vendored_own: tests/test_vendored.cu $(VENDORED_OWN_DIR)/router_own_input.cu $(VENDORED_OBJ)
	$(call vendored_build,$(VENDORED_BOTH),$(VENDORED_OWN_DIR)/router_own_input.cu,router_own_input,-DVENDORED_OWN -DVENDORED_ESCALE)

# Everything a GPU machine runs, built here to be carried there (build/):
# `make` alone leaves the test programs as they were, and a stale
# build/tests/test_gpu once ran a device call on the previous commit's tests.
.PHONY: gpu-build
gpu-build: all $(TEST_BINS) $(BUILD)/tests/test_vendored $(BUILD)/tests/test_vendored_splitk $(BUILD)/tests/test_vendored_gemv \
  $(BUILD)/tests/test_vendored_fp8 $(BUILD)/tests/test_vendored_fp8_gemv $(BUILD)/tests/test_vendored_given \
  $(BUILD)/tests/test_vendored_own $(BUILD)/tests/test_vendored_chain $(BUILD)/tests/test_vendored_pairs

.PHONY: test-vendored
test-vendored: $(BUILD)/tests/test_vendored
	@$(BUILD)/tests/test_vendored examples/specs/$(VENDORED_SPEC).moe

.PHONY: test-vendored-splitk
test-vendored-splitk: $(BUILD)/tests/test_vendored_splitk
	@$(BUILD)/tests/test_vendored_splitk examples/specs/$(VENDORED_SPEC).moe

.PHONY: test-vendored-gemv
test-vendored-gemv: $(BUILD)/tests/test_vendored_gemv
	@$(BUILD)/tests/test_vendored_gemv examples/specs/$(VENDORED_SPEC).moe

.PHONY: test-vendored-pairs
test-vendored-pairs: $(BUILD)/tests/test_vendored_pairs
	@$(BUILD)/tests/test_vendored_pairs examples/specs/$(VENDORED_SPEC).moe

.PHONY: test-vendored-chain
test-vendored-chain: $(BUILD)/tests/test_vendored_chain
	@$(BUILD)/tests/test_vendored_chain examples/specs/$(VENDORED_SPEC).moe

.PHONY: test-vendored-given
test-vendored-given: $(BUILD)/tests/test_vendored_given
	@$(BUILD)/tests/test_vendored_given tests/specs/given_weights.moe

.PHONY: test-vendored-own
test-vendored-own: $(BUILD)/tests/test_vendored_own
	@$(BUILD)/tests/test_vendored_own tests/specs/router_own_input.moe

.PHONY: test-vendored-fp8
test-vendored-fp8: $(BUILD)/tests/test_vendored_fp8
	@$(BUILD)/tests/test_vendored_fp8 examples/specs/fp8/$(VENDORED_FP8_SPEC).moe

.PHONY: test-vendored-fp8-gemv
test-vendored-fp8-gemv: $(BUILD)/tests/test_vendored_fp8_gemv
	@$(BUILD)/tests/test_vendored_fp8_gemv examples/specs/fp8/$(VENDORED_FP8_SPEC).moe

# ---- benchmark and example programs -------------------------------------
$(BUILD)/moe_bench: bench/moe_bench.c $(TEST_LIB) $(BUILD)/libmoegen.a
	$(CC) $(WARN) $(CFLAGS) $(CPPFLAGS) -Itests/support $< $(TEST_LIB) $(BUILD)/libmoegen.a $(LDLIBS) -o $@

# The examples are what users copy: built with runtime/moe.h and the flags
# build/moegen.pc gives (-Iruntime, libmoegen.a and its libraries) alone;
# test_install builds them again against an installed prefix.
$(BUILD)/moe_ep_example: examples/moe_ep_example.c $(BUILD)/libmoegen.a
	$(CC) $(WARN) $(CFLAGS) -Iruntime $< $(BUILD)/libmoegen.a $(LDLIBS) -o $@

$(BUILD)/moe_example: examples/moe_example.c $(BUILD)/libmoegen.a
	$(CC) $(WARN) $(CFLAGS) -Iruntime $< $(BUILD)/libmoegen.a $(LDLIBS) -o $@


# ---- the CPU reference as a shared library (not shipped, not in `all`) ---
# build/libmoegen_ref.so: tests/support/ref.c and the spec loader behind a
# small C ABI (tests/support/ref_lib.c) for bench/check_models.py's CPU
# backend, which checks moegen's semantics against Hugging Face's MoE blocks.
# It finds its Lua beside it, as libmoegen.so does.
REFLIB_SRC := tests/support/ref_lib.c tests/support/ref.c runtime/half.c runtime/fp8.c gen/spec.c gen/spec_check.c \
              gen/spec_schema.c gen/sandbox.c gen/util.c
.PHONY: ref-lib
ref-lib: $(BUILD)/libmoegen_ref.so
$(BUILD)/libmoegen_ref.so: $(REFLIB_SRC) $(wildcard gen/*.h runtime/*.h tests/support/*.h) $(BUILD)/liblua5.4.so.0 | deps
	$(CC) $(WARN) $(CFLAGS) -fPIC -shared $(CPPFLAGS) -Itests/support $(REFLIB_SRC) -L$(BUILD) -l:liblua5.4.so.0 \
	  -Wl,-rpath,'$$ORIGIN' -lm -o $@

# ---- shared library and pkg-config file ----------------------------------
# Debian's static Lua is not position-independent, so the shared library
# links Debian's liblua5.4.so.0 (the static library and the command link Lua
# statically and need no Lua on the machine they run on); jansson the same
# (libjansson.so.4).
# A copy of those libraries sits beside it (found through $$ORIGIN), so
# build/ carries everything libmoegen.so needs to a machine without Lua.
# It exports the functions runtime/moe.h declares and nothing else (the
# generator's and runtime's internals stay local, so they cannot clash with
# a program's symbols): the linker version script is made from moe.h's
# declarations (a line starting at column 0 with a type, then moe_NAME( ),
# plus TOOL_EXPORTS, hooks for the repository's own tools that are not
# part of the stable API (bench/compare_torch.py times the stages with
# moe_forward_timed). test_install checks the exported set.
TOOL_EXPORTS := moe_forward_timed
$(BUILD)/libmoegen.map: runtime/moe.h Makefile
	@mkdir -p $(BUILD)
	@{ printf '{\n  global:\n'; \
	   { sed -n 's/^[A-Za-z][A-Za-z0-9_ ]*[ *]\(moe_[a-z0-9_]*\)(.*/\1/p' runtime/moe.h; \
	     for t in $(TOOL_EXPORTS); do echo $$t; done; } | sed 's/.*/    &;/'; \
	   printf '  local: *;\n};\n'; } > $@
$(BUILD)/libmoegen.so: $(GEN_SRC) $(RT_SRC) $(BUILD)/templates_embed.c $(BUILD)/tuning_embed.c $(BUILD)/launch_geom_embed.c $(BUILD)/liblua5.4.so.0 $(BUILD)/libjansson.so.4 $(BUILD)/libmoegen.map Makefile
	$(CC) $(WARN) $(CFLAGS) -fPIC -shared $(CPPFLAGS) $(filter %.c,$^) -L$(BUILD) -l:liblua5.4.so.0 -l:libjansson.so.4 \
	  -Wl,-soname,libmoegen.so.$(SOVERSION) -Wl,--version-script=$(BUILD)/libmoegen.map -Wl,-rpath,'$$ORIGIN' \
	  $(filter-out $(LUA_LIB) $(JANSSON_LIB),$(LDLIBS)) -o $@

$(BUILD)/liblua5.4.so.0: $(LUA_LIB)
	@mkdir -p $(BUILD)
	cp -L $(dir $(LUA_LIB))liblua5.4.so.0 $@

# jansson likewise: Debian's libjansson.a is not position-independent
$(BUILD)/libjansson.so.4: $(JANSSON_LIB)
	@mkdir -p $(BUILD)
	cp -L $(dir $(JANSSON_LIB))libjansson.so.4 $@

# the version string's one home is gen/version.h
VERSION := $(shell sed -n 's/^\#define MOEGEN_VERSION "\(.*\)"/\1/p' gen/version.h)
# the shared library's ABI version (its SONAME is libmoegen.so.SOVERSION):
# raise it when a public struct or function in runtime/moe.h changes incompatibly
SOVERSION := 0
$(BUILD)/moegen.pc: Makefile gen/version.h
	@mkdir -p $(BUILD)
	@printf 'prefix=%s\nName: moegen\nDescription: MoE layer code generator and runtime\nVersion: $(VERSION)\nCflags: -I$${prefix}/runtime\nLibs: $${prefix}/$(BUILD)/libmoegen.a $(LDLIBS)\n' "$(CURDIR)" > $@


# ---- the CPU tests under sanitizers (not part of make test) ---------------
# `make test-sanitize` builds the command, the library, the examples and the
# CPU test programs into build-san/ (never mixed with build/'s objects) under
# AddressSanitizer + UndefinedBehaviorSanitizer (every UBSan finding fatal)
# with LeakSanitizer on, and runs them as test-cpu does (build-san/flags
# records the flags: other flags build it afresh). The tests run
# build-san/moegen (tests/check.h's MOEGEN_BUILD), so the command is checked
# too. Every report of every process, the commands the tests start included
# (whose stderr a test may swallow), goes to build-san/sanitizer/report.PID;
# any report fails the target and is printed. Leaks count: the tests free
# what they make, so a leak is a destroy or an error path of the library that
# forgot something. tests/sanitize.supp names the third-party leaks ignored
# (each with its reason). test_python runs with libasan preloaded into the
# interpreter, leak checks off (its rule says why). Left out: test_install
# (`make install` of build/ and a cc build against it: packaging, no code of
# ours under the sanitizers).
SAN_BUILD := build-san
# (gcc's `undefined` leaves out float-cast-overflow, a float converted to an
# integer type that cannot hold it, which is undefined in C: asked for by name)
SAN_FLAGS := -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=undefined,float-cast-overflow \
             -fno-omit-frame-pointer -g -O1
SAN_TESTS := $(filter-out test_install,$(CPU_TESTS))
SAN_LOG    = $(abspath $(SAN_BUILD))/sanitizer
SAN_ENV    = ASAN_OPTIONS=log_path=$(SAN_LOG)/report:detect_leaks=1:detect_stack_use_after_return=1 \
             UBSAN_OPTIONS=log_path=$(SAN_LOG)/report:print_stacktrace=1:halt_on_error=1 \
             LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitize.supp
.PHONY: test-sanitize
test-sanitize: layers
	@if [ "$$(cat $(SAN_BUILD)/flags 2>/dev/null)" != "$(SAN_FLAGS)" ]; then \
	    rm -rf $(SAN_BUILD) && mkdir -p $(SAN_BUILD) && echo "$(SAN_FLAGS)" > $(SAN_BUILD)/flags; fi
	$(MAKE) BUILD=$(SAN_BUILD) CFLAGS='$(SAN_FLAGS)' $(SAN_BUILD)/moegen $(SAN_BUILD)/moe_ep_example \
	  $(addprefix $(SAN_BUILD)/tests/,$(SAN_TESTS))
	@rm -rf $(SAN_LOG) && mkdir -p $(SAN_LOG)
	@status=0; $(SAN_ENV) bash tests/run.sh $(SAN_BUILD) $(SAN_TESTS) || status=1; \
	if [ -n "$$(ls $(SAN_LOG))" ]; then cat $(SAN_LOG)/*; \
	    echo "test-sanitize: $$(ls $(SAN_LOG) | wc -l) sanitizer report(s) in $(SAN_LOG)" >&2; status=1; fi; \
	exit $$status

# ---- fuzzing (not part of make test) -------------------------------------
# `make fuzz` builds libFuzzer harnesses (clang, ASan + UBSan, every UBSan
# finding fatal) over the spec loader + planner (under the embedded tuning
# table or one of tests/tune/'s, picked by the input's first byte), over
# emission (a planned spec must emit, every planned kernel defined) and
# over the tuning parser, and runs each for FUZZ_SECONDS (default 60) from a
# seed corpus of the repository's specs and tables; findings land in
# build/fuzz/. The harness sources are tests/fuzz/*.c.
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_FLAGS   := -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_GEN     := $(filter-out gen/emit.c gen/compile.c gen/cache.c gen/template.c,$(GEN_SRC))
# fuzz_emit runs the templates too (emission's sources, NVRTC's left out)
FUZZ_EMIT_GEN := $(filter-out gen/compile.c gen/cache.c,$(GEN_SRC))
FUZZ_EMBED   := $(BUILD)/tuning_embed.c $(BUILD)/templates_embed.c $(BUILD)/launch_geom_embed.c
.PHONY: fuzz fuzz-build
fuzz-build: $(BUILD)/fuzz/fuzz_spec $(BUILD)/fuzz/fuzz_emit $(BUILD)/fuzz/fuzz_tuning
$(BUILD)/fuzz/fuzz_spec $(BUILD)/fuzz/fuzz_tuning: $(BUILD)/fuzz/%: tests/fuzz/%.c tests/fuzz/fuzz_input.h $(FUZZ_GEN) $(FUZZ_EMBED) \
  $(wildcard gen/*.h) | deps
	@mkdir -p $(BUILD)/fuzz
	$(FUZZ_CC) $(FUZZ_FLAGS) -Igen -I$(LUA_INC) -DFUZZ_TUNE_DIR='"$(CURDIR)/tests/tune"' $< $(FUZZ_GEN) $(FUZZ_EMBED) \
	  $(LUA_LIB) -lm -ldl -o $@
$(BUILD)/fuzz/fuzz_emit: tests/fuzz/fuzz_emit.c tests/fuzz/fuzz_input.h $(FUZZ_EMIT_GEN) $(FUZZ_EMBED) $(wildcard gen/*.h) | deps
	@mkdir -p $(BUILD)/fuzz
	$(FUZZ_CC) $(FUZZ_FLAGS) -Igen -I$(LUA_INC) -DFUZZ_TUNE_DIR='"$(CURDIR)/tests/tune"' $< $(FUZZ_EMIT_GEN) $(FUZZ_EMBED) \
	  $(LUA_LIB) $(JANSSON_LIB) -lm -ldl -o $@
# the tuning tables the fuzzers plan under (tests/fuzz/fuzz_input.h holds the count)
FUZZ_TABLES = $(shell sed -n 's/^#define FUZZ_TABLES \([0-9]*\)$$/\1/p' tests/fuzz/fuzz_input.h)
fuzz: fuzz-build
	@mkdir -p $(BUILD)/fuzz/spec_corpus $(BUILD)/fuzz/emit_corpus $(BUILD)/fuzz/tuning_corpus
	@for f in examples/specs/*.moe examples/specs/fp8/*.moe tests/specs/*.moe tests/specs/bad/*.moe; do \
	    { printf '\000'; cat $$f; } > $(BUILD)/fuzz/spec_corpus/t_$$(basename $$f); \
	    { printf '\001'; cat $$f; } > $(BUILD)/fuzz/spec_corpus/f_$$(basename $$f); done
	@for f in examples/specs/*.moe examples/specs/fp8/*.moe tests/specs/*.moe; do for i in $$(seq 1 $(FUZZ_TABLES)); do \
	    { printf "\\$$(printf %o $$((2 * i)))"; cat $$f; } > $(BUILD)/fuzz/spec_corpus/tune$${i}_$$(basename $$f); done; done
	@cp $(BUILD)/fuzz/spec_corpus/t_* $(BUILD)/fuzz/spec_corpus/tune* $(BUILD)/fuzz/emit_corpus/
	@cp tuning/*.tune tests/tune/*.tune $(BUILD)/fuzz/tuning_corpus/
	cd $(BUILD)/fuzz && ./fuzz_spec -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=4096 -max_len=8192 \
	  -print_final_stats=1 spec_corpus
	cd $(BUILD)/fuzz && ./fuzz_emit -max_total_time=$(FUZZ_SECONDS) -timeout=30 -rss_limit_mb=4096 -max_len=8192 \
	  -print_final_stats=1 emit_corpus
	cd $(BUILD)/fuzz && ./fuzz_tuning -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
	  -print_final_stats=1 tuning_corpus
