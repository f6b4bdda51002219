# The sh probe: ok or denied for each attempt (sh has no errno names).
secret=$1 pid=$3 target=$4
t() { if "$@" >/dev/null 2>&1; then printf ok; else printf denied; fi; }
printf 'secret=%s ' "$(t cat "$secret")"
printf 'write=%s ' "$(t sh -c ': >"$1"' sh "$target")"
printf 'state=%s ' "$(t sh -c ': >"$FIRSTMATE_EXTENSION_STATE/probe"')"
printf 'tmp=%s ' "$(t sh -c 'f=$(mktemp) && rm "$f"')"
printf 'devnull=%s ' "$(t sh -c 'echo x >/dev/null')"
printf 'kill=%s ' "$(t kill -0 "$pid")"
printf 'etc=%s' "$(t cat /etc/hostname)"
