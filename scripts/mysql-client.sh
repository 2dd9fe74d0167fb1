# Sourced by the benchmark scripts: `mysql_client ARGS...` runs the mariadb client
# on $MYSQL_URL (mysql://USER[:PASSWORD]@HOST[:PORT]), which it cannot take itself.
mysql_client() {
    [[ $MYSQL_URL =~ ^mysql://([^:@/]+)(:([^@/]*))?@([^:/]+)(:([0-9]+))?/?$ ]] ||
        { echo "cannot read BENCH_MYSQL_URL=$MYSQL_URL (mysql://USER[:PASSWORD]@HOST[:PORT])" >&2; return 1; }
    local args=(-u "${BASH_REMATCH[1]}" -h "${BASH_REMATCH[4]}" -P "${BASH_REMATCH[6]:-3306}")
    [[ -n ${BASH_REMATCH[3]} ]] && args+=("-p${BASH_REMATCH[3]}")
    mariadb "${args[@]}" "$@"
}
