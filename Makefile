# dsflash: one Makefile. `make` builds build/dsflash; `make test` builds and runs every test.
# `make CC=clang BUILD=build-clang test` and `make asan` (ASan+UBSan) build in their own folders.
CC      ?= cc
BUILD   ?= build
OPT     ?= -O2 -g
WARN    := -Wall -Wextra -Wno-unused-parameter -Wshadow -Wstrict-prototypes -Wmissing-prototypes
CSTD    := -std=c11 -D_GNU_SOURCE
CFLAGS  ?= $(OPT)
ALLCFLAGS = $(CSTD) $(WARN) $(CFLAGS) -Iinclude -Isrc -pthread -MMD -MP $(EXTRA_CFLAGS)
LIBS    := -lpcre2-8 -ljansson -lutf8proc -lmicrohttpd -lm -lpthread
LDFLAGS ?=

# ISA-specific kernels: each file is compiled with only its own flags (STYLE.md "SIMD").
AVX2_FLAGS   := -mavx2 -mfma -mf16c
AVX512_FLAGS := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mavx512vnni -mavx512vbmi -mfma -mf16c

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
check:
	$(MAKE) EXTRA_CFLAGS=-Werror test
	$(MAKE) CC=clang BUILD=build-clang EXTRA_CFLAGS=-Werror all
	$(MAKE) asan

bench: $(BUILD)/dsflash
	./$(BUILD)/dsflash bench --kernels

# libFuzzer harness for the GGUF reader (clang + libclang-rt): FUZZ_TIME seconds (default 60).
FUZZ_TIME ?= 60
FUZZ_SRC  := src/gguf.c src/quant.c src/util.c
fuzz:
	@mkdir -p build-fuzz/corpus
	clang $(CSTD) $(WARN) -O1 -g -Iinclude -Isrc -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	    tests/fuzz/fuzz_gguf.c $(FUZZ_SRC) -lm -o build-fuzz/fuzz_gguf
	cp tests/fuzz/*.gguf build-fuzz/corpus/
	if [ -f ../shared/testdata/tiny41/tiny41.gguf ]; then head -c 65536 ../shared/testdata/tiny41/tiny41.gguf > build-fuzz/corpus/tiny41-head; fi
	./build-fuzz/fuzz_gguf -max_total_time=$(FUZZ_TIME) -max_len=70000 -rss_limit_mb=2048 build-fuzz/corpus

clean:
	rm -rf build build-clang build-asan build-fuzz

-include $(LIB_OBJ:.o=.d) $(TOOL_OBJ:.o=.d) $(TEST_OBJ:.o=.d)
