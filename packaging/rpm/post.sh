# choria-provisioner %post. $1 is 1 on the first install, 2 or more on an upgrade (from the Go
# package too). Every step is skipped or harmless where systemd is not running.

# The helpers' state directory, as the Go package makes it (cargo-generate-rpm 0.21 cannot
# ship a directory entry).
if [ ! -d /var/lib/choria-provisioner ]; then
    mkdir -p /var/lib/choria-provisioner
    chmod 0750 /var/lib/choria-provisioner
fi

if [ "$1" -eq 1 ] && command -v systemctl >/dev/null 2>&1; then
    # First install: the host's preset policy, which leaves the service disabled unless the
    # host says otherwise (as the Go package). Works without a running systemd.
    systemctl --no-reload preset choria-provisioner.service >/dev/null 2>&1 || :
fi

if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi

if [ "$1" -ge 2 ]; then
    # The restart waits for %posttrans, when the old package's files are gone and the new
    # binary is in place.
    mkdir -p /var/lib/rpm-state/choria-provisioner
    : >/var/lib/rpm-state/choria-provisioner/try-restart
fi
exit 0
