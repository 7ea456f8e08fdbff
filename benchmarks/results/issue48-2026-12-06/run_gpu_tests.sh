# The gpu-marked tests of the files this session touched, on the tree as committed (8516c50 and after).
PYTHONPATH=. timeout 250 python -m pytest -q -p no:cacheprovider -m gpu tests/test_tiered.py tests/test_trace_once.py \
    tests/cache tests/capture 2>&1 | grep -v "torch.__trace" | tail -150 > $OUT/gpu_tests.txt
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/card.txt
tail -5 $OUT/gpu_tests.txt
