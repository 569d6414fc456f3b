#!/usr/bin/env bash
# Debian tools the tests drive for real: promtool/prometheus, ethtool and iproute2 (veth), Chromium (status page),
# Alertmanager (amtool, and the server tests/e2e/test_paging.py routes pages through), VictoriaMetrics with vmagent
# and vmalert (the fleet test's distributed path), Slurm's controller, node daemon and client with munge
# (tests/e2e/test_slurm.py: a one-node cluster on loopback). Installs
# only what is missing, and only as root; otherwise says what is missing.
set -euo pipefail
declare -A need=(
  [promtool]=prometheus
  [prometheus]=prometheus
  [ethtool]=ethtool
  [ip]=iproute2
  [chromium]=chromium
  [chromedriver]=chromium-driver
  [amtool]=prometheus-alertmanager
  [prometheus-alertmanager]=prometheus-alertmanager
  [prometheus-node-exporter]=prometheus-node-exporter
  [victoria-metrics]=victoria-metrics
  [vmagent]=victoria-metrics
  [vmalert]=victoria-metrics
  [munged]=munge
  [slurmctld]=slurmctld
  [slurmd]=slurmd
  [sbatch]=slurm-client
  [srun]=slurm-client
  [squeue]=slurm-client
)
missing=()
for tool in "${!need[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("${need[$tool]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
if [ "$(id -u)" -ne 0 ]; then
  echo "install-system-deps: not root; missing Debian packages: ${missing[*]} (tests that need them will say so)" >&2
  exit 0
fi
echo "install-system-deps: apt-get install ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
