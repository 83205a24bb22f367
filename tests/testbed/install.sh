#!/bin/bash
# Install what the two-"node" beds need (sshbed.sh, slurmbed.sh), or NVMe offload needs, if anything is missing: Debian/Ubuntu
# packages, as root. Exits non-zero with the reason when it cannot; the tests then fail with it.
# Services are not started by the packages: a policy-rc.d that refuses them is put in place for the install
# when the system has none (Debian's own mechanism, invoke-rc.d(8)), so nothing keeps running afterwards.
set -euo pipefail
# What: `multinode` (default: the beds' daemons and clients) or `nvme` (libaio's header and library, which
# DeepSpeed's async_io op compiles against for ZeRO-Infinity's NVMe offload; benchmarks/infinity.py).
# Each pair is "program-or-absolute-path:package".
case "${1:-multinode}" in
  multinode) pairs="sshd:openssh-server ssh:openssh-client pdsh:pdsh slurmctld:slurmctld slurmd:slurmd
                    sbatch:slurm-client munged:munge mungekey:munge" ;;
  nvme) pairs="/usr/include/libaio.h:libaio-dev" ;;
  *) echo "testbed: unknown set '$1' (multinode | nvme)"; exit 1 ;;
esac
need=()
for pair in $pairs; do
  bin=${pair%%:*}; pkg=${pair#*:}
  if [[ $bin == /* ]]; then
    [ -e "$bin" ] && continue
  elif command -v "$bin" > /dev/null || [ -x "/usr/sbin/$bin" ]; then
    continue
  fi
  [[ " ${need[*]-} " == *" $pkg "* ]] || need+=("$pkg")
done
if [ ${#need[@]} -eq 0 ]; then echo "testbed: everything installed"; exit 0; fi
[ "$(id -u)" = 0 ] || { echo "testbed: root is needed to apt-get install ${need[*]}"; exit 1; }
command -v apt-get > /dev/null || { echo "testbed: no apt-get here; install ${need[*]} by other means"; exit 1; }
policy=/usr/sbin/policy-rc.d
ours=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod 755 "$policy"; ours=1
fi
trap '[ "$ours" = 1 ] && rm -f "$policy"' EXIT
export DEBIAN_FRONTEND=noninteractive
echo "testbed: apt-get install ${need[*]}"
if ! apt-get install -y -q --no-install-recommends "${need[@]}"; then
  apt-get update -q && apt-get install -y -q --no-install-recommends "${need[@]}"
fi
