[ -e multilora_studio/resources ] || ln -s ../resources multilora_studio/resources
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device_pkg/whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
for run in first second; do
timeout 100 python3 -c "
import time; t=time.perf_counter()
from multilora_studio.engine import Engine, EngineConfig
t1=time.perf_counter()
with Engine(EngineConfig(model='random:llama3-8b', device='cuda', max_loras=32)) as e:
    t2=time.perf_counter()
    print('$run', 'import', round(t1-t,1), 'start', round(t2-t1,1), {k: round(v,2) for k,v in e.runner.startup_seconds.items()}, flush=True)
" 2>&1 | grep -E "^(first|second)|Error" | tee -a $OUT/start.log
done
