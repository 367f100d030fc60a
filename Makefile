# Two entry points: `make demo` and `make test`. Both create/reuse .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

.PHONY: demo test setup clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip >/dev/null 2>&1 || true
	# CPU build of torch from the local wheel cache; pinned so pip never pulls a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m dsv4.demo

# Triton kernels against their torch references through Triton's CPU interpreter (the H200 runs all of tests/gpu)
KERNEL_TESTS := $(addprefix tests/gpu/,test_norm_rope.py test_topk.py test_cache_store.py test_indexer_scores.py \
	test_attention.py test_prefill_attention.py test_router.py test_swiglu.py test_sampler_gpu.py test_mhc.py \
	test_projections.py test_grouped_w8a16.py test_moe_align.py test_requant.py test_moe_gemv_words.py \
	test_block_sites.py test_router_quant.py test_moe_combine.py test_decode_step_fusions.py test_site_fusions.py \
	test_token_mask.py test_page_copy.py test_moe_gemv_down_launch.py)

test: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=15 tests
	@if $(BIN)/python -c "import triton" 2>/dev/null; then \
	  DSV4_TEST_DEVICE=cpu TRITON_INTERPRET=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 --dist loadfile \
	    -p no:cacheprovider -W "ignore::DeprecationWarning:triton.runtime.interpreter" $(KERNEL_TESTS); \
	else echo "triton is not installed here: the kernels' interpreter tests did not run"; fi

clean:
	rm -rf $(VENV) build *.egg-info
