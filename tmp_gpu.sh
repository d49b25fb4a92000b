[ -e multilora_studio/resources ] || ln -s ../resources multilora_studio/resources
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device_pkg/whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
timeout 190 python3 -m benchmarks.slot_span_gpu --rounds 3 --json $OUT/span.json 2>&1 | grep -v "INFO" | tail -12 | tee $OUT/span.log
timeout 230 python3 -m multilora_studio bench latency --model random:llama3-8b --device cuda --dtype bfloat16 --rank 16 --targets all --max-loras 32 --no-progress --json $OUT/latency.json 2>&1 | grep -v "INFO" | tail -25 | tee $OUT/latency.log
TRITON_INTERPRET=0 MULTILORA_TEST_DEVICE=cuda MULTILORA_TEST_TOKENIZER_DIR=$PWD/.device_pkg/tokenizer timeout 150 python3 -m pytest -q -p no:cacheprovider tests/engine/test_fidelity.py 2>&1 | tail -4 | tee $OUT/tests.log
