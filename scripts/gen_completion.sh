#!/usr/bin/env bash
# Writes the bash completion of a ddprun program from its own --help, so that it completes every
# flag the program has and never one it lost: the flags are the option lines of the help (lines
# starting with "-" after indentation), and a flag followed by an upper-case word there takes a value.
#   gen_completion.sh BINARY NAME OUTPUT
set -euo pipefail
bin=$1 name=$2 out=$3
help=$("$bin" --help)
flags=() valued=()
while IFS= read -r line; do
  # "  -m, --module", "  --nnodes VALUE", "  --host ADDR      description", "  --run_id, --rdzv_id VALUE"
  spec=${line#"${line%%[! ]*}"}
  spec=${spec%%  *}
  read -r -a words <<<"${spec//,/ }"
  last=""
  for w in "${words[@]}"; do
    if [[ $w == -* ]]; then
      flags+=("$w")
      last+=" $w"
    elif [[ $w =~ ^[A-Z][A-Z0-9_:.|=,-]*$ && -n $last ]]; then
      valued+=($last)
    fi
  done
done < <(grep -E '^ {1,10}-' <<<"$help")
# Flags of subcommands, from the usage lines ("ddprun-rendezvous status --endpoint HOST:PORT ...").
while IFS= read -r pair; do
  read -r f v <<<"$pair"
  [[ " ${flags[*]} " == *" $f "* ]] || flags+=("$f")
  [[ -n ${v:-} && " ${valued[*]} " != *" $f "* ]] && valued+=("$f")
done < <(grep -E "^(usage: |Usage: | +)$name " <<<"$help" | grep -oE -- '--[a-z][a-z0-9_-]*( [A-Z][A-Z0-9_:.|-]*)?')
fn="_${name//-/_}"
mkdir -p "$(dirname "$out")"
{
  echo "# bash completion for $name, generated from \`$name --help\` by ddprun's scripts/gen_completion.sh"
  echo "$fn() {"
  echo "  local cur=\${COMP_WORDS[COMP_CWORD]} prev=\${COMP_WORDS[COMP_CWORD-1]}"
  echo "  local flags='${flags[*]}'"
  echo "  local valued=' ${valued[*]} '"
  if [[ $name == ddprun ]]; then
    # Everything after the program is the program's: complete files there, not ddprun's flags.
    cat <<'BODY'
  local i w
  for ((i = 1; i < COMP_CWORD; i++)); do
    w=${COMP_WORDS[i]}
    if [[ $w == -* ]]; then
      [[ $w != *=* && $valued == *" $w "* ]] && ((i++))
    else
      COMPREPLY=($(compgen -f -- "$cur"))
      return
    fi
  done
  case $prev in
    --rdzv_backend|--rdzv-backend) COMPREPLY=($(compgen -W 'static c10d etcd' -- "$cur")); return ;;
    --nproc_per_node|--nproc-per-node) COMPREPLY=($(compgen -W 'cpu gpu auto 1 2 4 8' -- "$cur")); return ;;
    --log_dir|--log-dir) COMPREPLY=($(compgen -d -- "$cur")); return ;;
  esac
BODY
  elif [[ $name == ddprun-top ]]; then
    # TARGET: HOST:PORT, a port or a run id; nothing to complete from files.
    cat <<'BODY'
  case $prev in
    --interval) COMPREPLY=($(compgen -W '0.5 1 2 5' -- "$cur")); return ;;
  esac
  if [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "$flags" -- "$cur"))
  fi
}
BODY
  else
    cat <<'BODY'
  if ((COMP_CWORD == 1)) && [[ $cur != -* ]]; then
    COMPREPLY=($(compgen -W 'status token' -- "$cur"))
    return
  fi
  case $prev in
    --log-level) COMPREPLY=($(compgen -W 'debug info warn error' -- "$cur")); return ;;
    --token-file|--port-file|--output) COMPREPLY=($(compgen -f -- "$cur")); return ;;
  esac
BODY
  fi
  [[ $name == ddprun-top ]] || cat <<'BODY'
  if [[ $valued == *" $prev "* ]]; then
    COMPREPLY=($(compgen -f -- "$cur"))
    return
  fi
  if [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "$flags" -- "$cur"))
    return
  fi
  COMPREPLY=($(compgen -f -- "$cur"))
}
BODY
  echo "complete -F $fn $name"
} > "$out.tmp"
mv "$out.tmp" "$out"
