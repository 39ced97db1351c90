# Sourced by the benchmarks that run the examples: reading the JSON line an example ends with.
# json: the last {"example": ...} line of stdin; field NAME: that line's numeric field NAME.
json() { grep -o '{"example".*}' | tail -1; }
field() { sed -n "s/.*\"$1\": \([0-9.]*\).*/\1/p"; }
