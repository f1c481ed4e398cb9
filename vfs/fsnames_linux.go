package vfs

import "golang.org/x/sys/unix"

// fsNames names file systems by the magic number statfs(2) reports, so
// that an error says "ext4", not "0xef53". Pseudo ones are the kernel's
// views (proc, sysfs, ...): they hold no data, and nothing may be stored
// on them.
var fsNames = map[int64]struct {
	name   string
	pseudo bool
}{
	unix.TMPFS_MAGIC:           {"tmpfs", false},
	unix.HUGETLBFS_MAGIC:       {"hugetlbfs", false},
	unix.RAMFS_MAGIC:           {"ramfs", false},
	unix.EXT4_SUPER_MAGIC:      {"ext4", false}, // ext2 and ext3 share it
	unix.XFS_SUPER_MAGIC:       {"xfs", false},
	unix.BTRFS_SUPER_MAGIC:     {"btrfs", false},
	unix.F2FS_SUPER_MAGIC:      {"f2fs", false},
	unix.BCACHEFS_SUPER_MAGIC:  {"bcachefs", false},
	unix.NILFS_SUPER_MAGIC:     {"nilfs2", false},
	0x2fc12fc1:                 {"zfs", false},
	unix.OVERLAYFS_SUPER_MAGIC: {"overlay", false},
	unix.SQUASHFS_MAGIC:        {"squashfs", false},
	unix.EROFS_SUPER_MAGIC_V1:  {"erofs", false},
	unix.ISOFS_SUPER_MAGIC:     {"iso9660", false},
	unix.MSDOS_SUPER_MAGIC:     {"vfat", false},
	unix.EXFAT_SUPER_MAGIC:     {"exfat", false},
	unix.NFS_SUPER_MAGIC:       {"nfs", false},
	unix.SMB_SUPER_MAGIC:       {"smb", false},
	unix.CIFS_SUPER_MAGIC:      {"cifs", false},
	unix.SMB2_SUPER_MAGIC:      {"smb2", false},
	unix.V9FS_MAGIC:            {"9p", false},
	unix.FUSE_SUPER_MAGIC:      {"fuse", false},
	0x00c36400:                 {"ceph", false},
	0x0bd00bd0:                 {"lustre", false},
	0x47504653:                 {"gpfs", false},
	0x19830326:                 {"beegfs", false},
	unix.ZONEFS_MAGIC:          {"zonefs", false},
	unix.HOSTFS_SUPER_MAGIC:    {"hostfs", false},

	unix.PROC_SUPER_MAGIC:    {"proc", true},
	unix.SYSFS_MAGIC:         {"sysfs", true},
	unix.CGROUP_SUPER_MAGIC:  {"cgroup", true},
	unix.CGROUP2_SUPER_MAGIC: {"cgroup2", true},
	unix.DEVPTS_SUPER_MAGIC:  {"devpts", true},
	unix.DEBUGFS_MAGIC:       {"debugfs", true},
	unix.TRACEFS_MAGIC:       {"tracefs", true},
	unix.SECURITYFS_MAGIC:    {"securityfs", true},
	unix.SELINUX_MAGIC:       {"selinuxfs", true},
	unix.SMACK_MAGIC:         {"smackfs", true},
	unix.BPF_FS_MAGIC:        {"bpf", true},
	unix.EFIVARFS_MAGIC:      {"efivarfs", true},
	unix.PSTOREFS_MAGIC:      {"pstore", true},
	unix.BINFMTFS_MAGIC:      {"binfmt_misc", true},
	unix.AUTOFS_SUPER_MAGIC:  {"autofs", true},
	unix.NSFS_MAGIC:          {"nsfs", true},
	unix.XENFS_SUPER_MAGIC:   {"xenfs", true},
	0x62656570:               {"configfs", true},
	0x19800202:               {"mqueue", true},
}
