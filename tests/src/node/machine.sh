# Sourced by the shell of a `PrivateMachine` (tests/src/node/machine.rs), inside its new mount,
# network and PID namespaces: functions that make them look like a fresh machine.

# private_parent PARENT NAME...: PARENT becomes $T/root/PARENT, whose entries are the machine's
# own (bind-mounted; symlinks copied) except the NAMEs, which start absent. What a run creates in
# PARENT is written under $T, nothing of the machine's is changed, and of the machine's only the
# NAMEs are hidden. (A bind mount on PARENT/NAME itself would not do: a run could not remove
# it, and PARENT/NAME may not exist to mount on.)
private_parent() {
    local parent=$1 copy=$T/root$1 entry name
    shift
    mkdir -p "$copy"
    for entry in "$parent"/* "$parent"/.[!.]*; do
        [ -e "$entry" ] || [ -L "$entry" ] || continue
        name=${entry##*/}
        case " $* " in *" $name "*) continue ;; esac
        if [ -L "$entry" ]; then
            cp -P "$entry" "$copy/$name"
        elif [ -d "$entry" ]; then
            mkdir "$copy/$name"
            mount --rbind "$entry" "$copy/$name"
        else
            touch "$copy/$name"
            mount --bind "$entry" "$copy/$name"
        fi
    done
    mount --rbind "$copy" "$parent"
}

# machine_network ADDRESS/PREFIX GATEWAY: the loopback, and one interface `eth0` with that
# address and a default route through GATEWAY, as a machine has. Its peer is in this namespace
# too: nothing leaves it.
machine_network() {
    ip link set lo up
    ip link add eth0 type veth peer name eth0-peer
    ip addr add "$1" dev eth0
    ip link set eth0 up
    ip link set eth0-peer up
    ip route add default via "$2"
}
