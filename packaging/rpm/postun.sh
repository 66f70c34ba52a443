# choria-provisioner %postun. $1 is 0 on erase, 1 or more after an upgrade. systemd forgets the
# removed or replaced unit file (skipped where systemd is not running). On erase, the package's
# directories go when they are empty (rpm does not own them: cargo-generate-rpm 0.21 cannot
# ship a directory entry); a directory holding a kept .rpmsave or a helper's files stays.
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
if [ "$1" -eq 0 ]; then
    rmdir /usr/share/doc/choria-provisioner/examples/helpers \
        /usr/share/doc/choria-provisioner/examples /usr/share/doc/choria-provisioner \
        /var/lib/choria-provisioner /etc/choria-provisioner 2>/dev/null || :
fi
exit 0
