#!/usr/bin/env bash
# The outputs of fastgen generate / profile / eval (plain, --sweep, --chat) /
# demo on the two story models and SmolLM2 (the JSON of profile and eval --sweep too), timing figures masked, one file per run: what a
# refactor must leave byte-identical. Run it with the binary before and
# after, then compare the folders:
#   bash scripts/outputs.sh /tmp/before/fastgen /tmp/out-before
#   bash scripts/outputs.sh build/tools/fastgen /tmp/out-after
#   diff -r /tmp/out-before /tmp/out-after
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 FASTGEN OUTDIR" >&2; exit 2; }
bin=$1 out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
shared=${FASTGEN_MODELS:-$root/../shared/models}
smollm2=$(bash "$root/scripts/get-models.sh" smollm2 | awk '$1 == "smollm2" { print $2 }')
mkdir -p "$out"
mask() {
  sed -E 's/[0-9.]+ tokens\/s/X tokens\/s/g; s/[0-9.]+ s\b/X s/g; s/in [0-9.]+ (s|ms)/in X \1/g;
    s/^( *(prompt )?eval: ).*/\1X/'
}
i=0
run() {
  i=$((i + 1))
  { "$bin" "$@" 2>&1 && echo "rc=0" || echo "rc=$?"; } | mask > "$out/$i.txt"
  echo "$*" > "$out/$i.cmd"
}
for m in "$shared/stories260K.bin" "$shared/babyllama105.bin -z $shared/tok105.bin" "$smollm2"; do
  for policy in fastgen fastgen-budget fastgen-adaptive full h2o tova snapkv; do
    run generate -m $m -n 24 -p "Once upon a time" --policy $policy
  done
  run generate -m $m -n 16 -p "The cat sat" --json --samples 2
  run profile -m $m -p "Once upon a time there was a dog" -n 24
  run profile -m $m -p "Once upon a time there was a dog" -n 24 --json
  run eval -m $m --limit 2 -n 12 -q
done
run generate -m "$smollm2" -n 12 --f32-activations -p "Hello"
run generate -m "$smollm2" --chat "$root/tests/data/smollm2-chat.txt" -n 12 --json
run eval -m "$shared/stories260K.bin" --sweep --limit 2 -n 8 -q
run eval -m "$shared/stories260K.bin" --sweep --limit 2 -n 8 -q --json
long=$root/build/outputs-long2.txt  # two long dev prompts (the same path before and after)
mkdir -p "$root/build"
python3 "$root/scripts/long_prompts.py" "$root/tests/data/dev-smollm2.txt" | sed -n 1,2p > "$long"
run eval -m "$smollm2" --prompts "$long" --sweep --budgets 0.25,0.5 -n 8 -q --json
run eval -m "$shared/stories260K.bin" --chat "$root/tests/data/story-turns.txt" --limit 2 -n 8 -q
run demo --synthetic --prompt 128 --steps 16 --layers 1
echo "$i runs in $out"
