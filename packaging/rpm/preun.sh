# choria-provisioner %preun. $1 is 0 on erase (disable and stop, as the Go package), 1 or more
# when an upgrade removes the old version (nothing: %posttrans restarts). `disable --now` is
# not used: EL7's systemd 219 lacks it.
if [ "$1" -eq 0 ]; then
    if command -v systemctl >/dev/null 2>&1; then
        systemctl --no-reload disable choria-provisioner.service >/dev/null 2>&1 || :
    fi
    if [ -d /run/systemd/system ]; then
        systemctl stop choria-provisioner.service >/dev/null 2>&1 || :
    fi
fi
exit 0
