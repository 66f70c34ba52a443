if [ "$1" -eq 1 ]; then
    systemctl --no-reload preset choria-provisioner >/dev/null 2>&1 || :
fi
systemctl --system daemon-reload >/dev/null 2>&1 || :
if [ "$1" -ge 2 ]; then
    systemctl try-restart choria-provisioner >/dev/null 2>&1 || :
fi
