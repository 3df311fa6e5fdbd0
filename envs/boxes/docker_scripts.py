"""The shell the docker backend runs inside a container: the exec wrapper and the killer.

Why shell: a task image is any image with /bin/sh; nothing else can be assumed inside it. Why a
scan of /proc rather than `kill -9 -1`: that would also end the lifetime sleep (and with it the
container), and a timed-out exec must end its own processes, not its neighbours'.

Each `docker exec` is a session of its own (runc makes the exec's process a session leader), so
an exec's processes are that session plus whatever its members forked into a new session while
they live: the killer takes the session, then grows the set through parent links until it is
closed, kills it with SIGKILL, and scans again (a fork in between is caught by the next scan),
up to 50 scans. It uses shell built-ins only (read, set, case, kill), so it keeps working when a
fork bomb holds every pid: it runs no other command at all, since a fork that fails ends dash
(status 2) whatever the command's redirections (tests/test_docker_killer.py). When it cannot
start, or leaves something alive after its 50 scans, the caller removes the whole sandbox.
"""

__all__ = ["KILL", "WRAP_ARGV", "WRAP_STRING"]

# The wrapper every exec runs in: its first stdout line is its pid (the session to end on timeout).
WRAP_ARGV = 'echo $$; exec "$@"'
WRAP_STRING = 'echo $$; if command -v bash >/dev/null 2>&1; then exec bash -lc "$1"; fi; exec sh -c "$1"'

# $1: a session leader's pid (end it and its descendants) or 0 (everything but PID 1 and the
# lifetime sleep); $2: 1 when PID 1 is an init whose first child is the lifetime sleep (the child
# of PID 1 that started first). Exit 0 once a scan finds nothing left to kill.
KILL = r"""t=$1; init=$2; me=$$; n=0
while [ $n -lt 50 ]; do
  n=$((n + 1)); procs=; life=; at=
  for d in /proc/[0-9]*; do
    read -r s 2>/dev/null <"$d/stat" || continue
    p=${d#/proc/}; s=${s##*) }; set -- $s
    [ "$1" = Z ] && continue
    procs="$procs $p:$2:$4"
    if [ "$init" = 1 ] && [ "$2" = 1 ]; then
      if [ -z "$life" ] || [ "${20}" -lt "$at" ] || { [ "${20}" = "$at" ] && [ "$p" -lt "$life" ]; }; then
        life=$p; at=${20}
      fi
    fi
  done
  v=; grow=1
  while [ $grow = 1 ]; do
    grow=0
    for e in $procs; do
      p=${e%%:*}; r=${e#*:}; pp=${r%%:*}; sid=${r#*:}
      case " $v " in *" $p "*) continue ;; esac
      case $p in 1 | "$me" | "$life") continue ;; esac
      if [ "$t" = 0 ] || [ "$sid" = "$t" ] || case " $v " in *" $pp "*) true ;; *) false ;; esac; then
        v="$v $p"; grow=1
      fi
    done
    [ "$t" = 0 ] && grow=0
  done
  [ -z "$v" ] && exit 0
  kill -9 $v 2>/dev/null
done
exit 1"""
