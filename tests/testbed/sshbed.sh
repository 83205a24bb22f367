#!/bin/bash
# Two-"node" test bed for the multi-node tests (pdsh/ssh and SLURM on loopback), started and stopped by
# tests/test_multinode.py; Debian bookworm as root (install.sh installs openssh-server openssh-client pdsh
# slurmctld slurmd slurm-client munge when missing).
# Throwaway two-"node" ssh test bed on loopback: one sshd per "node", so that one can be lost on its own.
#   ./sshbed.sh up              -> starts sshd on 127.0.0.1:2222 (node1) and 127.0.0.2:2222 (node2)
#   ./sshbed.sh down            -> kills both sshd by pidfile
#   ./sshbed.sh node-down NODE  -> the node is lost: its sshd and everything running under it (its sessions,
#                                  the ranks they started) are killed, and it answers no more ssh
#   ./sshbed.sh node-up NODE    -> its sshd again
#   ./sshbed.sh env             -> prints the env a test needs (eval "$(./sshbed.sh env)")
set -euo pipefail
D=${SSHBED_DIR:-${TMPDIR:-/tmp}/dstk-testbed/ssh}
PORT=${SSHBED_PORT:-2222}

up() {
  mkdir -p "$D" "$D/bin"
  chmod 700 "$D"
  [ -f "$D/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$D/host_ed25519" -C bed-host
  [ -f "$D/id_ed25519" ]   || ssh-keygen -q -t ed25519 -N '' -f "$D/id_ed25519" -C bed-user
  cp "$D/id_ed25519.pub" "$D/authorized_keys"
  # sshd (OpenSSH 9.2) refuses to start without its privsep dir (compiled-in path)
  mkdir -p /run/sshd && chmod 755 /run/sshd

  cat > "$D/sshd_config" <<EOF
Port $PORT
HostKey $D/host_ed25519
AuthorizedKeysFile $D/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PermitUserEnvironment no
AcceptEnv *
X11Forwarding no
PrintMotd no
LogLevel ERROR
Subsystem sftp internal-sftp
EOF

  cat > "$D/ssh_config" <<EOF
Host node1
    HostName 127.0.0.1
Host node2
    HostName 127.0.0.2
Host node1 node2 127.0.0.1 127.0.0.2
    Port $PORT
    User root
    IdentityFile $D/id_ed25519
    IdentitiesOnly yes
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    GlobalKnownHostsFile /dev/null
    LogLevel ERROR
    BatchMode yes
EOF

  # ssh wrapper: DeepSpeed's runner calls plain `ssh node1 hostname` (no -F), and pdsh
  # execs `ssh` via PATH, so a PATH-first wrapper makes both use the private config
  # without touching ~/.ssh or /etc/ssh.
  cat > "$D/bin/ssh" <<EOF
#!/bin/sh
exec /usr/bin/ssh -F $D/ssh_config "\$@"
EOF
  chmod +x "$D/bin/ssh"

  /usr/sbin/sshd -t -f "$D/sshd_config"
  node_up node1
  node_up node2
}

address() { case "$1" in node1) echo 127.0.0.1;; node2) echo 127.0.0.2;; *) echo "sshbed: no node '$1'" >&2; exit 2;; esac; }

node_up() {
  local addr; addr=$(address "$1")
  /usr/sbin/sshd -f "$D/sshd_config" -o "ListenAddress=$addr" -o "PidFile=$D/sshd-$1.pid" -E "$D/sshd-$1.log"
  for i in $(seq 50); do [ -s "$D/sshd-$1.pid" ] && break; sleep 0.1; done
  echo "$1: sshd pid $(cat "$D/sshd-$1.pid")"
}

descendants() {
  local p
  for p in $(ps -eo pid=,ppid= | awk -v pp="$1" '$2 == pp {print $1}'); do echo "$p"; descendants "$p"; done
}

node_down() {
  address "$1" > /dev/null
  local pidfile="$D/sshd-$1.pid"
  [ -f "$pidfile" ] || { echo "$1: no sshd running"; return 0; }
  local pid all
  pid=$(cat "$pidfile")
  all="$pid $(descendants "$pid" | tr "\n" " ")"
  kill -STOP $all 2>/dev/null || true  # frozen first, so that nothing it runs reacts before it is gone
  kill -KILL $all 2>/dev/null || true
  rm -f "$pidfile"
  echo "$1: down (killed $all)"
}

down() {
  local n pid
  for n in node1 node2; do
    [ -f "$D/sshd-$n.pid" ] || continue
    pid=$(cat "$D/sshd-$n.pid")
    kill "$pid" 2>/dev/null || true
    # ignore zombies: PID 1 in this container reaps orphans only every ~2s
    for i in $(seq 100); do st=$(ps -o stat= -p "$pid" 2>/dev/null) || break; [[ $st == Z* ]] && break; sleep 0.05; done
    rm -f "$D/sshd-$n.pid"
  done
  # per-connection sshd children exit when their session ends; report any stragglers
  ps -eo pid,stat,args | awk '$2 !~ /^Z/' | grep "[s]shd.*$D" || echo "no sshd left"
}

# Optional: make node1/node2 resolvable for everything (gloo MASTER_ADDR=node1 etc.).
# /etc/hosts is writable in this container; rewrite in place (not rename) in case it is bind-mounted.
hosts_add() {
  hosts_del
  printf '127.0.0.1 node1 # sshbed\n127.0.0.2 node2 # sshbed\n' >> /etc/hosts
}
hosts_del() {
  local keep; keep=$(grep -v '# sshbed$' /etc/hosts || true)
  printf '%s\n' "$keep" > /etc/hosts
}

envs() {
  echo "export PATH=$D/bin:\$PATH"
  echo "export PDSH_RCMD_TYPE=ssh"
}

case "${1:-}" in
  up) up;; down) down;; node-down) node_down "${2:-}";; node-up) node_up "${2:-}";; env) envs;;
  hosts-add) hosts_add;; hosts-del) hosts_del;;
  *) echo "usage: $0 up|down|node-down NODE|node-up NODE|env|hosts-add|hosts-del"; exit 2;;
esac
