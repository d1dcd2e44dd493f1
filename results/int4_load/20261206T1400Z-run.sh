set -x
cd /work/main
for i in 1 2; do
.venv/bin/omni-ray stage --model qwen2.5-3b-full-vocab --quantization cpu_int4 --kv-cache-mib 256 --max-model-len 1024 --prompt-len 128 --output-len 64 --repeats 2 --no-detokenize --out /tmp/lead/atload/s24f-atload-$i.json
.venv/bin/omni-ray stage --model /tmp/lead/q3b/int4 --kv-cache-mib 256 --max-model-len 1024 --prompt-len 128 --output-len 64 --repeats 2 --no-detokenize --out /tmp/lead/atload/s24f-prequant-$i.json
done
