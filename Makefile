# dsflash: one Makefile. `make` builds build/dsflash; `make test` builds and runs every test.
# `make CC=clang BUILD=build-clang test` and `make asan` (ASan+UBSan) build in their own folders.
CC      ?= cc
BUILD   ?= build
OPT     ?= -O2 -g
WARN    := -Wall -Wextra -Wno-unused-parameter -Wshadow -Wstrict-prototypes -Wmissing-prototypes
CSTD    := -std=c11 -D_GNU_SOURCE -ffp-contract=off
CFLAGS  ?= $(OPT)
ALLCFLAGS = $(CSTD) $(WARN) $(CFLAGS) -Iinclude -Isrc -pthread -MMD -MP $(EXTRA_CFLAGS)
LIBS    := -lpcre2-8 -ljansson -lutf8proc -lmicrohttpd -lm -lpthread
LDFLAGS ?=

# ISA-specific kernels: each file is compiled with only its own flags (STYLE.md "SIMD").
AVX2_FLAGS   := -mavx2 -mfma -mf16c
AVX512_FLAGS := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mavx512vnni -mavx512vbmi -mfma -mf16c
AMX_FLAGS    := $(AVX512_FLAGS) -mamx-tile -mamx-bf16

LIB_SRC   := $(sort $(wildcard src/*.c))
TOOL_SRC  := $(sort $(wildcard tools/*.c))
TEST_SRC  := $(sort $(wildcard tests/*.c))
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/%.o)
TOOL_OBJ  := $(TOOL_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ  := $(TEST_SRC:%.c=$(BUILD)/%.o)

.PHONY: all test asan clang check clean bench fuzz deps demo
all: $(BUILD)/dsflash

$(BUILD)/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) $(AVX2_FLAGS) -c $< -o $@
$(BUILD)/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) $(AVX512_FLAGS) -c $< -o $@
$(BUILD)/%_amx.o: %_amx.c
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) $(AMX_FLAGS) -c $< -o $@
$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -c $< -o $@

$(BUILD)/libdsflash.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

# Whole-archive: subcommands and tests register themselves with constructors.
$(BUILD)/dsflash: $(TOOL_OBJ) $(BUILD)/libdsflash.a
	$(CC) $(ALLCFLAGS) $(LDFLAGS) -o $@ $(TOOL_OBJ) $(BUILD)/libdsflash.a $(LIBS)

$(BUILD)/dsflash-test: $(TEST_OBJ) $(BUILD)/libdsflash.a $(BUILD)/dsflash
	$(CC) $(ALLCFLAGS) $(LDFLAGS) -o $@ $(TEST_OBJ) $(BUILD)/libdsflash.a $(LIBS)

# The test runner's last line is "N passed, N failed[, N skipped]".
test: $(BUILD)/dsflash-test $(BUILD)/dsflash
	DSF_BIN=$(BUILD)/dsflash ./$(BUILD)/dsflash-test $(T)

# Installs missing Debian packages (apt-get; sudo when not root).
deps:
	./scripts/deps.sh

# The README's main job: a random-weight tiny model generated here, then one prompt.
demo: $(BUILD)/dsflash
	./$(BUILD)/dsflash synth --preset tiny $(BUILD)/tiny.gguf
	./$(BUILD)/dsflash run -m $(BUILD)/tiny.gguf -p "Hello! Who are you?" -n 48

clang:
	$(MAKE) CC=clang BUILD=build-clang test

asan:
	$(MAKE) CC=clang BUILD=build-asan OPT="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" \
	    LDFLAGS="-fsanitize=address,undefined" test

# Everything CI and a developer should run: gcc, clang (warning-free), sanitizers.
# The -Werror builds go to folders of their own: EXTRA_CFLAGS does not trigger a rebuild, so
# objects reused from build/ or build-clang/ would never be compiled with -Werror.
check:
	$(MAKE) BUILD=build-werror EXTRA_CFLAGS=-Werror test
	$(MAKE) CC=clang BUILD=build-clang-werror EXTRA_CFLAGS=-Werror all build-clang-werror/dsflash-test
	$(MAKE) asan

bench: $(BUILD)/dsflash
	./$(BUILD)/dsflash bench --kernels

# libFuzzer harnesses (clang + libclang-rt), one per parser: tests/fuzz/fuzz_NAME.c -> build-fuzz/fuzz_NAME,
# linked against the library built with fuzzer coverage + ASan/UBSan in build-fuzz/obj. Each runs for
# FUZZ_TIME seconds (default 30) on its corpus build-fuzz/corpus/fuzz_NAME (seeded from tests/fuzz/seeds/
# fuzz_NAME and ../shared when present; dictionary tests/fuzz/fuzz_NAME.dict if any); a crash leaves crash-* here and stops. FUZZ_ONLY=NAME runs one.
FUZZ_TIME   ?= 30
FUZZ_ONLY   ?=
FUZZ_SAN    := -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_ALL    := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_SRC    := $(if $(FUZZ_ONLY),$(filter tests/fuzz/fuzz_$(FUZZ_ONLY).c,$(FUZZ_ALL)),$(FUZZ_ALL))
FUZZ_BINS   := $(FUZZ_SRC:tests/fuzz/%.c=build-fuzz/%)
FUZZ_SHARED := ../shared
.PHONY: fuzz-build fuzz-lib
fuzz-lib:
	$(MAKE) CC=clang BUILD=build-fuzz/obj OPT="-O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link $(FUZZ_SAN)" \
	    build-fuzz/obj/libdsflash.a
build-fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_common.h fuzz-lib
	clang $(CSTD) $(WARN) -O1 -g -Iinclude -Isrc -fsanitize=fuzzer $(FUZZ_SAN) $< build-fuzz/obj/libdsflash.a $(LIBS) -o $@
fuzz-build: $(FUZZ_BINS)
fuzz: fuzz-build
	@set -e; for b in $(FUZZ_BINS); do n=$${b##*/}; c=build-fuzz/corpus/$$n; mkdir -p $$c; \
	  if [ -d tests/fuzz/seeds/$$n ]; then cp tests/fuzz/seeds/$$n/* $$c/; fi; \
	  if [ $$n = fuzz_gguf ]; then cp tests/fuzz/*.gguf $$c/; \
	    if [ -f $(FUZZ_SHARED)/testdata/tiny41/tiny41.gguf ]; then head -c 65536 $(FUZZ_SHARED)/testdata/tiny41/tiny41.gguf > $$c/tiny41-head; fi; fi; \
	  if [ $$n = fuzz_vocab ] && [ -f $(FUZZ_SHARED)/testdata/tiny41/hf/tokenizer.json ]; then \
	    { printf '\000'; cat $(FUZZ_SHARED)/testdata/tiny41/hf/tokenizer.json; } > $$c/tiny41-tokenizer-json; fi; \
	  d=; if [ -f tests/fuzz/$$n.dict ]; then d=-dict=tests/fuzz/$$n.dict; fi; \
	  echo "== $$n: $(FUZZ_TIME) s, log build-fuzz/$$n.log"; \
	  if ./$$b $$d -max_total_time=$(FUZZ_TIME) -max_len=70000 -rss_limit_mb=2048 -timeout=20 -print_final_stats=1 \
	       -artifact_prefix=build-fuzz/$$n- $$c > build-fuzz/$$n.log 2>&1; then \
	    grep -E "^(Done|stat::number_of_executed_units)" build-fuzz/$$n.log || true; \
	  else tail -n 40 build-fuzz/$$n.log; echo "$$n: FAILED, input saved as build-fuzz/$$n-*"; exit 1; fi; \
	done

clean:
	rm -rf build build-clang build-asan build-fuzz

-include $(LIB_OBJ:.o=.d) $(TOOL_OBJ:.o=.d) $(TEST_OBJ:.o=.d)
