-- Raised alarms (etcd's alarm bucket): one row per member and alarm type, kept
-- in the database so every instance on it refuses writes alike.
CREATE TABLE alarm (
    member_id INTEGER NOT NULL,  -- etcd member id, as a signed 64-bit number
    alarm     INTEGER NOT NULL,  -- etcdserverpb.AlarmType: 1 NOSPACE, 2 CORRUPT
    PRIMARY KEY (member_id, alarm)
);
