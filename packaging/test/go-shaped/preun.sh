if [ "$1" -eq 0 ]; then
    systemctl --no-reload disable --now choria-provisioner >/dev/null 2>&1 || :
fi
