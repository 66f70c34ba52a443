# choria-provisioner %posttrans: after an upgrade (%post left a mark), restart the service if it
# runs, now that the whole transaction is done. Skipped where systemd is not running.
if [ -e /var/lib/rpm-state/choria-provisioner/try-restart ]; then
    rm -f /var/lib/rpm-state/choria-provisioner/try-restart
    rmdir /var/lib/rpm-state/choria-provisioner 2>/dev/null || :
    if [ -d /run/systemd/system ]; then
        systemctl try-restart choria-provisioner.service >/dev/null 2>&1 || :
    fi
fi
exit 0
