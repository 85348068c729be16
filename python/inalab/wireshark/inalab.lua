-- Wireshark dissector for inalab (in-network aggregation lab) traffic: Wireshark 4.x, Lua 5.2 or later.
--
--   * the UDP data plane: every datagram is one frame (a 16-byte envelope, a protocol header
--     of kind 0..8, a payload of little-endian 4-byte values), followed in the UDP runtime by
--     a 24-byte trailer: the sealer's sequence number (replay protection) and a 16-byte tag
--     (HMAC-SHA256 or BLAKE3 under the job's key: shown, not checked). A UDP
--     GSO train (several datagrams captured as one, on loopback) is dissected frame by frame.
--     Registered as a heuristic dissector on UDP (magic 0x1AAB, version 1) and on the UDP
--     ports of preference "inalab.udp_ports" (default 9000,9200: the switch's and the PS's);
--     "Decode As..." offers it for any other port.
--   * the control plane: newline-delimited JSON over TCP on the ports of preference
--     "inalab.ctl.tcp_ports" (default 9100,9300: the switch's and the PS's control ports),
--     each line a tree item (op, event, ok, error, job, ...) handed to the JSON dissector.
--
-- The wire format's authority is crates/inalab-wire (frame.rs, header.rs and one file per
-- header kind) and crates/inalab-net (auth.rs, control.rs); this file mirrors their checks:
-- what the Rust decoder rejects is flagged as expert info (group Malformed).
--
-- Install: `inalab wireshark --install` (copies this file to ~/.local/lib/wireshark/plugins/),
-- or run `tshark -X lua_script:$(inalab wireshark --path) -r capture.pcapng`.

-- Lua 5.2 (Wireshark up to 4.2) has bit32; Lua 5.3 and later have the operators (parsed at
-- run time, so that 5.2 never sees them).
local band, rshift
if bit32 ~= nil then
    band, rshift = bit32.band, bit32.rshift
else
    band = load("return function(a, b) return math.tointeger(a) & math.tointeger(b) end")()
    rshift = load("return function(a, n) return math.tointeger(a) >> n end")()
end

local MAGIC = 0x1AAB
local VERSION = 1
local ENVELOPE_LEN = 16
local SEQ_LEN = 8
local TAG_LEN = 16
local TRAILER_LEN = SEQ_LEN + TAG_LEN
local VALUE_LEN = 4

---------------------------------------------------------------------------------------------
-- The data plane
---------------------------------------------------------------------------------------------

local inalab = Proto("inalab", "inalab in-network aggregation frame")

local HEADER_KINDS = { [0] = "Raw", [1] = "Transport", [2] = "ATP", [3] = "SwitchML", [4] = "DSA",
    [5] = "Canary", [6] = "StaticTree", [7] = "Rina", [8] = "GRID" }
local PAYLOAD_KINDS = { [0] = "none", [1] = "i32", [2] = "f32" }

local F = {}

-- A header's flag bits: { mask, name, label } each, as { mask, name, field } with the field
-- `inalab.<scheme>.flags.<name>` (dashes as underscores) registered with the protocol.
local function flag_bits(scheme, bits)
    local out = {}
    for _, b in ipairs(bits) do
        local field = ProtoField.bool("inalab." .. scheme .. ".flags." .. b[2]:gsub("-", "_"), b[3], 8, nil, b[1])
        F[#F + 1] = field
        out[#out + 1] = { b[1], b[2], field }
    end
    return out
end
-- Envelope.
F.magic = ProtoField.uint16("inalab.magic", "Magic", base.HEX)
F.version = ProtoField.uint8("inalab.version", "Version")
F.flags = ProtoField.uint8("inalab.flags", "Flags", base.HEX)
F.flags_ecn = ProtoField.bool("inalab.flags.ecn", "ECN CE (congestion experienced)", 8, nil, 0x01)
F.flags_spare = ProtoField.uint8("inalab.flags.spare", "Spare bits", base.HEX, nil, 0xFE)
F.src = ProtoField.uint32("inalab.src", "Source node", base.DEC_HEX)
F.dst = ProtoField.uint32("inalab.dst", "Destination node", base.DEC_HEX)
F.srcport = ProtoField.uint16("inalab.srcport", "Source port")
F.dstport = ProtoField.uint16("inalab.dstport", "Destination port")
F.node = ProtoField.uint32("inalab.node", "Source or destination node", base.DEC_HEX)
F.port = ProtoField.uint16("inalab.port", "Source or destination port")
F.kind = ProtoField.uint8("inalab.kind", "Header kind", base.DEC, HEADER_KINDS)
F.job = ProtoField.uint32("inalab.job", "Job (any header kind)")
-- Payload, tag.
F.payload_kind = ProtoField.uint8("inalab.payload.kind", "Payload kind", base.DEC, PAYLOAD_KINDS)
F.payload_count = ProtoField.uint16("inalab.payload.count", "Value count")
F.values = ProtoField.bytes("inalab.values", "Values")
F.value = ProtoField.double("inalab.value", "Value")
F.seq = ProtoField.uint64("inalab.seq", "Sequence number")
F.tag = ProtoField.bytes("inalab.tag", "Tag")
F.tagged = ProtoField.bool("inalab.tagged", "Tagged")
F.frame_len = ProtoField.uint32("inalab.frame_len", "Frame length (without tag)")
F.segment = ProtoField.uint16("inalab.segment", "Frame in datagram (GSO train)")

-- Transport (1): the windowed host transport.
local SEG_KINDS = { [0] = "Data", [1] = "Ack" }
F.tr_kind = ProtoField.uint8("inalab.transport.kind", "Segment kind", base.DEC, SEG_KINDS)
F.tr_flags = ProtoField.uint8("inalab.transport.flags", "Flags", base.HEX)
F.tr_flags_ecn_echo = ProtoField.bool("inalab.transport.flags.ecn_echo", "ECN echo", 8, nil, 0x01)
F.tr_flags_retransmit = ProtoField.bool("inalab.transport.flags.retransmit", "Retransmit", 8, nil, 0x02)
F.tr_pad = ProtoField.uint16("inalab.transport.pad", "Padding", base.HEX)
F.tr_seq = ProtoField.uint32("inalab.transport.seq", "Sequence number")
F.tr_msg_id = ProtoField.uint64("inalab.transport.msg_id", "Message id")
F.tr_msg_offset = ProtoField.uint32("inalab.transport.msg_offset", "Message offset")
F.tr_msg_len = ProtoField.uint32("inalab.transport.msg_len", "Message length")
F.tr_seg_len = ProtoField.uint32("inalab.transport.seg_len", "Segment length")

-- ATP (2).
local ATP_ESI = { [0] = "to the level-1 switch", [1] = "to the level-2 switch", [2] = "aggregated at level 2, to the PS" }
F.atp_job = ProtoField.uint32("inalab.atp.job", "Job")
F.atp_seq = ProtoField.uint32("inalab.atp.seq", "Sequence number")
F.atp_agg_index = ProtoField.uint32("inalab.atp.agg_index", "Aggregator index")
F.atp_bitmap0 = ProtoField.uint32("inalab.atp.bitmap0", "Bitmap 0 (rack)", base.HEX)
F.atp_bitmap1 = ProtoField.uint32("inalab.atp.bitmap1", "Bitmap 1 (level 2)", base.HEX)
F.atp_fan_in0 = ProtoField.uint8("inalab.atp.fan_in0", "Fan-in 0")
F.atp_fan_in1 = ProtoField.uint8("inalab.atp.fan_in1", "Fan-in 1")
F.atp_esi = ProtoField.uint8("inalab.atp.esi", "Edge switch identifier", base.DEC, ATP_ESI)
F.atp_flags = ProtoField.uint8("inalab.atp.flags", "Flags", base.HEX)
local ATP_FLAGS = flag_bits("atp", {
    { 0x01, "resend", "Resend" },
    { 0x02, "ecn", "ECN" },
    { 0x04, "collision", "Collision" },
    { 0x08, "ack", "ACK (parameter packet)" },
    { 0x10, "overflow", "Overflow" },
    { 0x20, "float", "Float payload" },
    { 0x40, "rehash", "Rehash (new index in bitmap 0)" },
})

-- SwitchML (3).
F.sml_job = ProtoField.uint32("inalab.switchml.job", "Job")
F.sml_slot = ProtoField.uint32("inalab.switchml.slot", "Slot")
F.sml_chunk = ProtoField.uint32("inalab.switchml.chunk", "Chunk")
F.sml_wid = ProtoField.uint16("inalab.switchml.wid", "Worker id")
F.sml_ver = ProtoField.uint8("inalab.switchml.ver", "Slot version (shadow copy)")
F.sml_flags = ProtoField.uint8("inalab.switchml.flags", "Flags", base.HEX)
local SML_FLAGS = flag_bits("switchml", {
    { 0x01, "result", "Result" },
    { 0x02, "retransmit", "Retransmit" },
})
F.sml_exp = ProtoField.int8("inalab.switchml.exp", "Block exponent (next chunk)")

-- DSA (4).
local DSA_KINDS = { [0] = "Grad", [1] = "Ack", [2] = "Evict", [3] = "RemindSw", [4] = "RemindSwResp",
    [5] = "Notify", [6] = "Fetch", [7] = "FetchResp", [8] = "Move" }
F.dsa_job = ProtoField.uint16("inalab.dsa.job", "Job")
F.dsa_psn = ProtoField.uint32("inalab.dsa.psn", "Packet sequence number")
F.dsa_bitmap = ProtoField.uint32("inalab.dsa.bitmap", "Bitmap", base.HEX)
F.dsa_priority = ProtoField.uint32("inalab.dsa.priority", "Priority (16.16 fixed point, 1/ms)")
F.dsa_fan_in = ProtoField.uint8("inalab.dsa.fan_in", "Fan-in")
F.dsa_kind = ProtoField.uint8("inalab.dsa.kind", "Kind", base.DEC, DSA_KINDS, 0xF0)
F.dsa_flags = ProtoField.uint8("inalab.dsa.flags", "Flags", base.HEX, nil, 0x0F)
local DSA_FLAGS = flag_bits("dsa", {
    { 0x01, "ecn", "ECN" },
    { 0x02, "retx", "Retransmission" },
    { 0x04, "empty", "Empty (reminder reply)" },
    { 0x08, "result", "Result (final sum)" },
})

-- Canary (5).
local CANARY_TYPES = { [0] = "Reduce", [1] = "Result", [2] = "Restore", [3] = "RtxReq", [4] = "Fail", [5] = "Fallback" }
F.can_dst = ProtoField.uint32("inalab.canary.dst", "Destination (leader, or switch on Restore)", base.DEC_HEX)
F.can_id = ProtoField.uint32("inalab.canary.id", "Block id", base.HEX)
F.can_tenant = ProtoField.uint32("inalab.canary.tenant", "Tenant (job)", base.DEC, nil, 0xFF000000)
F.can_attempt = ProtoField.uint32("inalab.canary.attempt", "Attempt", base.DEC, nil, 0x00C00000)
F.can_seq = ProtoField.uint32("inalab.canary.seq", "Sequence number", base.DEC, nil, 0x003FFFFF)
F.can_counter = ProtoField.uint16("inalab.canary.counter", "Counter")
F.can_hosts = ProtoField.uint16("inalab.canary.hosts", "Hosts")
F.can_children = ProtoField.uint32("inalab.canary.children", "Children", base.HEX)
F.can_switch = ProtoField.uint16("inalab.canary.switch", "Switch")
F.can_flags = ProtoField.uint8("inalab.canary.flags", "Flags", base.HEX)
F.can_bypass = ProtoField.bool("inalab.canary.bypass", "Bypass", 8, nil, 0x80)
F.can_multicast = ProtoField.bool("inalab.canary.multicast", "Multicast", 8, nil, 0x40)
F.can_type = ProtoField.uint8("inalab.canary.type", "Type", base.DEC, CANARY_TYPES, 0x38)
F.can_shard = ProtoField.uint8("inalab.canary.shard", "Shard", base.DEC, nil, 0x06)
F.can_spare = ProtoField.uint8("inalab.canary.spare", "Spare bit", base.DEC, nil, 0x01)

-- Static tree (6).
local ST_KINDS = { [0] = "Reduce", [1] = "Result" }
F.st_job = ProtoField.uint16("inalab.static_tree.job", "Job")
F.st_tree = ProtoField.uint8("inalab.static_tree.tree", "Tree")
F.st_flags = ProtoField.uint8("inalab.static_tree.flags", "Flags", base.HEX)
F.st_kind = ProtoField.uint8("inalab.static_tree.kind", "Kind", base.DEC, ST_KINDS, 0xC0)
F.st_rtx = ProtoField.bool("inalab.static_tree.rtx", "Retransmission", 8, nil, 0x20)
F.st_spare = ProtoField.uint8("inalab.static_tree.spare", "Spare bits", base.HEX, nil, 0x1F)
F.st_seq = ProtoField.uint32("inalab.static_tree.seq", "Sequence number")
F.st_counter = ProtoField.uint16("inalab.static_tree.counter", "Counter")

-- Rina (7).
local RINA_KINDS = { [1] = "Task", [2] = "Pull", [3] = "Data", [4] = "Agg", [5] = "Ack", [6] = "Ag",
    [7] = "AgAck", [8] = "Nack" }
F.rina_kind = ProtoField.uint8("inalab.rina.kind", "Kind", base.DEC, RINA_KINDS)
F.rina_flags = ProtoField.uint8("inalab.rina.flags", "Flags", base.HEX)
local RINA_FLAGS = flag_bits("rina", {
    { 0x01, "ecn-echo", "ECN echo" },
    { 0x02, "retx", "Retransmission" },
    { 0x04, "full", "Full (finished sum)" },
    { 0x08, "repair", "Repair" },
})
F.rina_member = ProtoField.uint8("inalab.rina.member", "Member")
F.rina_hop = ProtoField.uint8("inalab.rina.hop", "Hop")
F.rina_job = ProtoField.uint16("inalab.rina.job", "Job")
F.rina_step = ProtoField.uint16("inalab.rina.step", "Step")
F.rina_chunk = ProtoField.uint16("inalab.rina.chunk", "Chunk")
F.rina_count = ProtoField.uint16("inalab.rina.count", "Count")
F.rina_req = ProtoField.uint32("inalab.rina.req", "Request", base.HEX)
F.rina_epoch = ProtoField.uint32("inalab.rina.req.epoch", "Epoch", base.DEC, nil, 0xFF000000)
F.rina_request = ProtoField.uint32("inalab.rina.req.request", "Request in epoch", base.DEC, nil, 0x00FFFFFF)
F.rina_seq = ProtoField.uint32("inalab.rina.seq", "Sequence number")
F.rina_slot = ProtoField.uint32("inalab.rina.slot", "Slot")
F.rina_arg = ProtoField.uint32("inalab.rina.arg", "Argument")

-- GRID (8).
F.grid_job = ProtoField.uint32("inalab.grid.job", "Job")
F.grid_frag = ProtoField.uint32("inalab.grid.frag", "Fragment")
F.grid_node = ProtoField.uint32("inalab.grid.node", "Aggregation node", base.DEC_HEX)
F.grid_bitmap = ProtoField.uint64("inalab.grid.bitmap", "Bitmap", base.HEX)
F.grid_fan_in = ProtoField.uint8("inalab.grid.fan_in", "Fan-in")
F.grid_flags = ProtoField.uint8("inalab.grid.flags", "Flags", base.HEX)
local GRID_FLAGS = flag_bits("grid", {
    { 0x01, "resend", "Resend" },
    { 0x02, "ecn", "ECN" },
    { 0x04, "control", "Control (rate synchronization)" },
    { 0x08, "result", "Result" },
    { 0x10, "collision", "Collision" },
    { 0x20, "overflow", "Overflow" },
})
F.grid_reserved = ProtoField.uint16("inalab.grid.reserved", "Reserved", base.HEX)

inalab.fields = F

local E = {
    short = ProtoExpert.new("inalab.expert.short", "Frame truncated", expert.group.MALFORMED, expert.severity.ERROR),
    bad_kind = ProtoExpert.new("inalab.expert.bad_kind", "Unknown header kind", expert.group.MALFORMED, expert.severity.ERROR),
    length = ProtoExpert.new("inalab.expert.length", "Length mismatch", expert.group.MALFORMED, expert.severity.ERROR),
    bad_value = ProtoExpert.new("inalab.expert.bad_value", "Field value the decoder rejects", expert.group.MALFORMED, expert.severity.ERROR),
    bad_magic = ProtoExpert.new("inalab.expert.bad_magic", "Not an inalab frame (magic or version)", expert.group.MALFORMED, expert.severity.ERROR),
    uncaptured = ProtoExpert.new("inalab.expert.uncaptured", "Bytes not in the capture", expert.group.UNDECODED, expert.severity.NOTE),
}
inalab.experts = { E.short, E.bad_kind, E.length, E.bad_value, E.bad_magic, E.uncaptured }

inalab.prefs.udp_ports = Pref.range("UDP ports", "9000,9200",
    "UDP ports always decoded as inalab (the switch's and the PS's data ports by default); " ..
    "datagrams on other ports are found by the heuristic (magic 0x1AAB, version 1)", 65535)
inalab.prefs.max_values = Pref.uint("Values as fields", 16,
    "How many values of each frame become inalab.value fields (the rest is shown as one item)")

local function flag_names(v, list)
    local names = {}
    for _, b in ipairs(list) do
        if band(v, b[1]) ~= 0 then names[#names + 1] = b[2] end
    end
    return names
end

local function add_flags(tree, field, range, list)
    local it = tree:add(field, range)
    for _, b in ipairs(list) do it:add(b[3], range) end
    return it
end

local function known_mask(list)
    local m = 0
    for _, b in ipairs(list) do m = m + b[1] end
    return m
end

-- Each header kind: its body length and a function that adds its fields under `tree` from
-- body offset `o` (after the kind tag), calls ctx.bad(item, text) for values the Rust decoder
-- rejects, and returns the Info summary and the job (if the header carries one).
local KINDS = {}

KINDS[0] = { len = 0, dissect = function(tvb, o, tree, ctx) return "Raw" end }

KINDS[1] = { len = 28, dissect = function(tvb, o, tree, ctx)
    local k = tvb(o, 1):uint()
    local ki = tree:add(F.tr_kind, tvb(o, 1))
    if SEG_KINDS[k] == nil then ctx.bad(ki, "transport kind " .. k .. " (0 Data, 1 Ack)") end
    local fl = tvb(o + 1, 1):uint()
    local fi = tree:add(F.tr_flags, tvb(o + 1, 1))
    fi:add(F.tr_flags_ecn_echo, tvb(o + 1, 1))
    fi:add(F.tr_flags_retransmit, tvb(o + 1, 1))
    if band(fl, 0xFC) ~= 0 then ctx.bad(fi, string.format("transport flags 0x%02x: unknown bits", fl)) end
    tree:add(F.tr_pad, tvb(o + 2, 2))
    tree:add(F.tr_seq, tvb(o + 4, 4))
    tree:add(F.tr_msg_id, tvb(o + 8, 8))
    tree:add(F.tr_msg_offset, tvb(o + 16, 4))
    tree:add(F.tr_msg_len, tvb(o + 20, 4))
    tree:add(F.tr_seg_len, tvb(o + 24, 4))
    local s = string.format("Transport %s seq=%d msg=%s off=%d len=%d seg=%d", SEG_KINDS[k] or ("kind" .. k),
        tvb(o + 4, 4):uint(), tostring(tvb(o + 8, 8):uint64()), tvb(o + 16, 4):uint(), tvb(o + 20, 4):uint(),
        tvb(o + 24, 4):uint())
    local names = flag_names(fl, { { 1, "ecn-echo" }, { 2, "retransmit" } })
    if #names > 0 then s = s .. " " .. table.concat(names, " ") end
    return s, nil
end }

KINDS[2] = { len = 24, dissect = function(tvb, o, tree, ctx)
    local job = tvb(o, 4):uint()
    tree:add(F.atp_job, tvb(o, 4))
    tree:add(F.atp_seq, tvb(o + 4, 4))
    tree:add(F.atp_agg_index, tvb(o + 8, 4))
    tree:add(F.atp_bitmap0, tvb(o + 12, 4))
    tree:add(F.atp_bitmap1, tvb(o + 16, 4))
    tree:add(F.atp_fan_in0, tvb(o + 20, 1))
    tree:add(F.atp_fan_in1, tvb(o + 21, 1))
    local esi = tvb(o + 22, 1):uint()
    local ei = tree:add(F.atp_esi, tvb(o + 22, 1))
    if esi > 2 then ctx.bad(ei, "atp esi " .. esi .. " (at most 2)") end
    local fl = tvb(o + 23, 1):uint()
    local fi = add_flags(tree, F.atp_flags, tvb(o + 23, 1), ATP_FLAGS)
    if band(fl, 0xFF - known_mask(ATP_FLAGS)) ~= 0 then ctx.bad(fi, string.format("atp flags 0x%02x: unknown bits", fl)) end
    local s = string.format("ATP job=%d seq=%d agg=%d esi=%d bitmap0=0x%08x bitmap1=0x%08x", job, tvb(o + 4, 4):uint(),
        tvb(o + 8, 4):uint(), esi, tvb(o + 12, 4):uint(), tvb(o + 16, 4):uint())
    local names = flag_names(fl, ATP_FLAGS)
    if #names > 0 then s = s .. " " .. table.concat(names, " ") end
    return s, job
end }

KINDS[3] = { len = 17, dissect = function(tvb, o, tree, ctx)
    local job = tvb(o, 4):uint()
    tree:add(F.sml_job, tvb(o, 4))
    tree:add(F.sml_slot, tvb(o + 4, 4))
    tree:add(F.sml_chunk, tvb(o + 8, 4))
    tree:add(F.sml_wid, tvb(o + 12, 2))
    local ver = tvb(o + 14, 1):uint()
    local vi = tree:add(F.sml_ver, tvb(o + 14, 1))
    if ver > 1 then ctx.bad(vi, "switchml ver " .. ver .. " (0 or 1)") end
    local fl = tvb(o + 15, 1):uint()
    local fi = add_flags(tree, F.sml_flags, tvb(o + 15, 1), SML_FLAGS)
    if band(fl, 0xFC) ~= 0 then ctx.bad(fi, string.format("switchml flags 0x%02x: unknown bits", fl)) end
    tree:add(F.sml_exp, tvb(o + 16, 1))
    local s = string.format("SwitchML job=%d slot=%d chunk=%d wid=%d ver=%d exp=%d", job, tvb(o + 4, 4):uint(),
        tvb(o + 8, 4):uint(), tvb(o + 12, 2):uint(), ver, tvb(o + 16, 1):int())
    local names = flag_names(fl, SML_FLAGS)
    if #names > 0 then s = s .. " " .. table.concat(names, " ") end
    return s, job
end }

KINDS[4] = { len = 16, dissect = function(tvb, o, tree, ctx)
    local job = tvb(o, 2):uint()
    tree:add(F.dsa_job, tvb(o, 2))
    tree:add(F.dsa_psn, tvb(o + 2, 4))
    local bitmap = tvb(o + 6, 4):uint()
    local bi = tree:add(F.dsa_bitmap, tvb(o + 6, 4))
    local prio = tvb(o + 10, 4):uint()
    tree:add(F.dsa_priority, tvb(o + 10, 4)):append_text(string.format(" (P = %.4f/ms)", prio / 65536))
    local fan_in = tvb(o + 14, 1):uint()
    local fni = tree:add(F.dsa_fan_in, tvb(o + 14, 1))
    local kf = tvb(o + 15, 1):uint()
    local k = rshift(kf, 4)
    local ki = tree:add(F.dsa_kind, tvb(o + 15, 1))
    local fi = tree:add(F.dsa_flags, tvb(o + 15, 1))
    for _, b in ipairs(DSA_FLAGS) do fi:add(b[3], tvb(o + 15, 1)) end
    if DSA_KINDS[k] == nil then ctx.bad(ki, "dsa kind " .. k .. " (at most 7)") end
    if fan_in == 0 or fan_in > 32 then
        ctx.bad(fni, "dsa fan_in " .. fan_in .. " (1..32)")
    else
        local full = fan_in >= 32 and 0xFFFFFFFF or (2 ^ fan_in - 1)
        if band(bitmap, 0xFFFFFFFF - full) ~= 0 then
            ctx.bad(bi, string.format("dsa bitmap 0x%08x: a contributor beyond fan_in %d", bitmap, fan_in))
        end
    end
    local s = string.format("DSA %s job=%d psn=%d bitmap=0x%08x fan_in=%d", DSA_KINDS[k] or ("kind" .. k), job,
        tvb(o + 2, 4):uint(), bitmap, fan_in)
    local names = flag_names(band(kf, 0x0F), DSA_FLAGS)
    if #names > 0 then s = s .. " " .. table.concat(names, " ") end
    return s, job
end }

KINDS[5] = { len = 19, dissect = function(tvb, o, tree, ctx)
    tree:add(F.can_dst, tvb(o, 4))
    local id = tvb(o + 4, 4):uint()
    local ii = tree:add(F.can_id, tvb(o + 4, 4))
    ii:add(F.can_tenant, tvb(o + 4, 4))
    ii:add(F.can_attempt, tvb(o + 4, 4))
    ii:add(F.can_seq, tvb(o + 4, 4))
    local counter, hosts = tvb(o + 8, 2):uint(), tvb(o + 10, 2):uint()
    local ci = tree:add(F.can_counter, tvb(o + 8, 2))
    tree:add(F.can_hosts, tvb(o + 10, 2))
    tree:add(F.can_children, tvb(o + 12, 4))
    tree:add(F.can_switch, tvb(o + 16, 2))
    local f = tvb(o + 18, 1):uint()
    local r = tvb(o + 18, 1)
    local fi = tree:add(F.can_flags, r)
    fi:add(F.can_bypass, r)
    fi:add(F.can_multicast, r)
    local ti = fi:add(F.can_type, r)
    fi:add(F.can_shard, r)
    local si = fi:add(F.can_spare, r)
    local t = band(rshift(f, 3), 7)
    if CANARY_TYPES[t] == nil then ctx.bad(ti, "canary type " .. t .. " (at most 5)") end
    if band(f, 1) ~= 0 then ctx.bad(si, "canary spare bit set") end
    if counter > hosts then ctx.bad(ci, string.format("canary counter %d above hosts %d", counter, hosts)) end
    local tenant = rshift(id, 24)
    local s = string.format("Canary %s tenant=%d attempt=%d seq=%d dst=%d counter=%d/%d", CANARY_TYPES[t] or ("type" .. t),
        tenant, band(rshift(id, 22), 3), band(id, 0x3FFFFF), tvb(o, 4):uint(), counter, hosts)
    if t == 2 then s = s .. string.format(" children=0x%08x shard=%d", tvb(o + 12, 4):uint(), band(rshift(f, 1), 3)) end
    if band(f, 0x80) ~= 0 then s = s .. " bypass" end
    if band(f, 0x40) ~= 0 then s = s .. " multicast" end
    return s, tenant
end }

KINDS[6] = { len = 10, dissect = function(tvb, o, tree, ctx)
    local job = tvb(o, 2):uint()
    tree:add(F.st_job, tvb(o, 2))
    tree:add(F.st_tree, tvb(o + 2, 1))
    local f = tvb(o + 3, 1):uint()
    local r = tvb(o + 3, 1)
    local fi = tree:add(F.st_flags, r)
    local ki = fi:add(F.st_kind, r)
    fi:add(F.st_rtx, r)
    local si = fi:add(F.st_spare, r)
    tree:add(F.st_seq, tvb(o + 4, 4))
    local counter = tvb(o + 8, 2):uint()
    local ci = tree:add(F.st_counter, tvb(o + 8, 2))
    local k = rshift(f, 6)
    if ST_KINDS[k] == nil then ctx.bad(ki, "static tree kind " .. k .. " (0 or 1)") end
    if band(f, 0x1F) ~= 0 then ctx.bad(si, "static tree spare bits set") end
    if counter == 0 then ctx.bad(ci, "static tree counter 0") end
    local s = string.format("StaticTree %s job=%d tree=%d seq=%d counter=%d", ST_KINDS[k] or ("kind" .. k), job,
        tvb(o + 2, 1):uint(), tvb(o + 4, 4):uint(), counter)
    if band(f, 0x20) ~= 0 then s = s .. " rtx" end
    return s, job
end }

KINDS[7] = { len = 28, dissect = function(tvb, o, tree, ctx)
    local k = tvb(o, 1):uint()
    local ki = tree:add(F.rina_kind, tvb(o, 1))
    if RINA_KINDS[k] == nil then ctx.bad(ki, "rina kind " .. k .. " (1..8)") end
    local fl = tvb(o + 1, 1):uint()
    local fi = add_flags(tree, F.rina_flags, tvb(o + 1, 1), RINA_FLAGS)
    if band(fl, 0xF0) ~= 0 then ctx.bad(fi, string.format("rina spare flags 0x%02x", band(fl, 0xF0))) end
    tree:add(F.rina_member, tvb(o + 2, 1))
    tree:add(F.rina_hop, tvb(o + 3, 1))
    local job = tvb(o + 4, 2):uint()
    tree:add(F.rina_job, tvb(o + 4, 2))
    tree:add(F.rina_step, tvb(o + 6, 2))
    tree:add(F.rina_chunk, tvb(o + 8, 2))
    tree:add(F.rina_count, tvb(o + 10, 2))
    local ri = tree:add(F.rina_req, tvb(o + 12, 4))
    ri:add(F.rina_epoch, tvb(o + 12, 4))
    ri:add(F.rina_request, tvb(o + 12, 4))
    tree:add(F.rina_seq, tvb(o + 16, 4))
    tree:add(F.rina_slot, tvb(o + 20, 4))
    tree:add(F.rina_arg, tvb(o + 24, 4))
    local s = string.format("Rina %s job=%d step=%d chunk=%d seq=%d slot=%d member=%d hop=%d", RINA_KINDS[k] or ("kind" .. k),
        job, tvb(o + 6, 2):uint(), tvb(o + 8, 2):uint(), tvb(o + 16, 4):uint(), tvb(o + 20, 4):uint(),
        tvb(o + 2, 1):uint(), tvb(o + 3, 1):uint())
    local names = flag_names(fl, RINA_FLAGS)
    if #names > 0 then s = s .. " " .. table.concat(names, " ") end
    return s, job
end }

KINDS[8] = { len = 24, dissect = function(tvb, o, tree, ctx)
    local job = tvb(o, 4):uint()
    tree:add(F.grid_job, tvb(o, 4))
    tree:add(F.grid_frag, tvb(o + 4, 4))
    tree:add(F.grid_node, tvb(o + 8, 4))
    tree:add(F.grid_bitmap, tvb(o + 12, 8))
    local fan_in = tvb(o + 20, 1):uint()
    local fni = tree:add(F.grid_fan_in, tvb(o + 20, 1))
    local fl = tvb(o + 21, 1):uint()
    local fi = add_flags(tree, F.grid_flags, tvb(o + 21, 1), GRID_FLAGS)
    local ri = tree:add(F.grid_reserved, tvb(o + 22, 2))
    if band(fl, 0xC0) ~= 0 then ctx.bad(fi, string.format("grid flags 0x%02x: unknown bits", fl)) end
    if tvb(o + 22, 2):uint() ~= 0 then ctx.bad(ri, "grid reserved field not 0") end
    if fan_in > 64 then ctx.bad(fni, "grid fan_in " .. fan_in .. " (at most 64)") end
    local s = string.format("GRID job=%d frag=%d node=%d bitmap=0x%s fan_in=%d", job, tvb(o + 4, 4):uint(),
        tvb(o + 8, 4):uint(), tvb(o + 12, 8):uint64():tohex(), fan_in)
    local names = flag_names(fl, GRID_FLAGS)
    if #names > 0 then s = s .. " " .. table.concat(names, " ") end
    return s, job
end }

local function fmt_value(kind, v)
    if kind == 2 then
        if v ~= v then return "NaN" end
        if v == math.huge then return "inf" end
        if v == -math.huge then return "-inf" end
        return string.format("%.9g", v)
    end
    return string.format("%d", v)
end

-- Whether the datagram holds another frame at `off` (a GSO train).
local function frame_at(tvb, off)
    return tvb:len() >= off + 3 and tvb(off, 2):uint() == MAGIC and tvb(off + 2, 1):uint() == VERSION
end

-- Dissects the frame at `off` (the `seg`-th of the datagram). Returns the bytes it used
-- (nil when nothing after it can be dissected) and its Info summary.
local function dissect_frame_in(tvb, pinfo, item, off, seg)
    local total = tvb:reported_len()      -- the datagram's length on the wire
    local cap = tvb:len()                 -- what the capture holds of it
    local cut = cap < total               -- snapshot length, or a simulated packet's size
    local avail = cap - off
    local problems = {}
    local function flag(it, e, text)
        it:add_proto_expert_info(e, text)
        -- What the capture left out is no fault of the frame's.
        if e ~= E.uncaptured then problems[#problems + 1] = text end
    end
    local function summary(s) return (#problems > 0) and (s .. " [Malformed: " .. table.concat(problems, "; ") .. "]") or s end
    if seg > 1 then item:add(F.segment, seg):set_generated() end

    -- Envelope.
    if avail < ENVELOPE_LEN then
        if cut and total - off >= ENVELOPE_LEN then
            flag(item, E.uncaptured, string.format("the capture holds %d of the envelope's %d bytes", avail, ENVELOPE_LEN))
        else
            flag(item, E.short, string.format("frame envelope: %d of %d bytes", avail, ENVELOPE_LEN))
        end
        return nil, summary("inalab")
    end
    local env = item:add(tvb(off, ENVELOPE_LEN), "Envelope")
    local mi = env:add(F.magic, tvb(off, 2))
    local vi = env:add(F.version, tvb(off + 2, 1))
    if tvb(off, 2):uint() ~= MAGIC then
        flag(mi, E.bad_magic, string.format("magic 0x%04x, not 0x1aab", tvb(off, 2):uint()))
        return nil, summary("inalab")
    end
    if tvb(off + 2, 1):uint() ~= VERSION then
        flag(vi, E.bad_magic, string.format("frame version %d (this dissector knows %d)", tvb(off + 2, 1):uint(), VERSION))
        return nil, summary("inalab")
    end
    local flags = tvb(off + 3, 1):uint()
    local fi = env:add(F.flags, tvb(off + 3, 1))
    fi:add(F.flags_ecn, tvb(off + 3, 1))
    fi:add(F.flags_spare, tvb(off + 3, 1))
    if band(flags, 0xFE) ~= 0 then flag(fi, E.bad_value, string.format("frame flags 0x%02x: unknown bits", flags)) end
    local src, dst = tvb(off + 4, 4):uint(), tvb(off + 8, 4):uint()
    env:add(F.src, tvb(off + 4, 4))
    env:add(F.dst, tvb(off + 8, 4))
    env:add(F.srcport, tvb(off + 12, 2))
    env:add(F.dstport, tvb(off + 14, 2))
    env:add(F.node, tvb(off + 4, 4)):set_hidden()
    env:add(F.node, tvb(off + 8, 4)):set_hidden()
    env:add(F.port, tvb(off + 12, 2)):set_hidden()
    env:add(F.port, tvb(off + 14, 2)):set_hidden()
    local nodes = string.format("%d \226\134\146 %d", src, dst)  -- "src -> dst" with a UTF-8 arrow
    if band(flags, 1) ~= 0 then nodes = nodes .. " CE" end

    -- Header.
    local h = off + ENVELOPE_LEN
    if avail < ENVELOPE_LEN + 1 then
        if cut then
            flag(item, E.uncaptured, "the header is not in the capture")
        else
            flag(item, E.short, "no header kind")
        end
        return nil, summary("Envelope only, " .. nodes)
    end
    local kind = tvb(h, 1):uint()
    local kinfo = KINDS[kind]
    local kname = HEADER_KINDS[kind]
    if kinfo == nil then
        local ki = item:add(F.kind, tvb(h, 1))
        flag(ki, E.bad_kind, "header kind " .. kind .. " (0..8)")
        return nil, summary("Unknown header kind " .. kind .. ", " .. nodes)
    end
    local hlen = 1 + kinfo.len
    local ht = item:add(tvb(h, math.min(hlen, cap - h)), kname .. " header")
    ht:add(F.kind, tvb(h, 1))
    if cap - h < hlen then
        if cut and total - h >= hlen then
            flag(ht, E.uncaptured, string.format("the capture holds %d of the %s header's %d bytes", cap - h, kname, hlen))
        else
            flag(ht, E.short, string.format("%s header: %d of %d bytes", kname, cap - h, hlen))
        end
        return nil, summary(kname .. ", " .. nodes)
    end
    local ctx = { bad = function(it, text) flag(it, E.bad_value, text) end }
    local info, job = kinfo.dissect(tvb, h + 1, ht, ctx)
    if job ~= nil then ht:add(F.job, job):set_generated() end

    -- Payload.
    local p = h + hlen
    if cap - p < 3 then
        if cut and total - p >= 3 then
            flag(item, E.uncaptured, "the payload's kind and count are not in the capture")
        else
            flag(item, E.short, string.format("payload kind and count: %d of 3 bytes", math.max(cap - p, 0)))
        end
        return nil, summary(info .. ", " .. nodes)
    end
    local pkind, count = tvb(p, 1):uint(), tvb(p + 1, 2):uint()
    local flen = p + 3 + count * VALUE_LEN - off
    local pname = PAYLOAD_KINDS[pkind]
    local pt = item:add(tvb(p, math.min(3 + count * VALUE_LEN, cap - p)), "Payload")
    local pki = pt:add(F.payload_kind, tvb(p, 1))
    pt:add(F.payload_count, tvb(p + 1, 2))
    if pname == nil then
        flag(pki, E.bad_value, "payload kind " .. pkind .. " (0 none, 1 i32, 2 f32)")
    elseif pkind == 0 and count > 0 then
        flag(pki, E.bad_value, "payload kind none with " .. count .. " values")
    end
    local v0 = p + 3
    local have = math.min(count, math.floor((cap - v0) / VALUE_LEN))
    local shown = {}
    if count > 0 then
        local vt = pt:add(F.values, tvb(v0, have * VALUE_LEN))
        vt:set_text(have == count and string.format("Values: %d", count)
            or string.format("Values: %d (%d in the capture)", count, have))
        local n = math.min(have, inalab.prefs.max_values)
        for i = 0, have - 1 do
            if i >= n and #shown >= 8 then break end
            local r = tvb(v0 + i * VALUE_LEN, VALUE_LEN)
            local v = (pkind == 2) and r:le_float() or r:le_int()
            local s = fmt_value(pkind, v)
            if #shown < 8 then shown[#shown + 1] = s end
            if i < n then vt:add(F.value, r, v, string.format("Value %d: %s", i, s)) end
        end
        if have > n then
            vt:add(tvb(v0 + n * VALUE_LEN, (have - n) * VALUE_LEN),
                string.format("%d more values (preference inalab.max_values shows %d)", have - n, n))
        end
    end
    local ptext = string.format("Payload: %s, %d values", pname or ("kind " .. pkind), count)
    if #shown > 0 then ptext = ptext .. " [" .. table.concat(shown, ", ") .. ((count > #shown) and ", ...]" or "]") end
    pt:set_text(ptext)
    if count > 0 then info = info .. string.format(", %d %s", count, pname or "values") end

    -- Frame length, tag, what follows.
    item:add(F.frame_len, flen):set_generated()
    local used
    if cap - off < flen then
        -- The datagram ends inside the values.
        if cut and total - off >= flen then
            flag(pt, E.uncaptured, string.format("the capture holds %d of %d values", have, count))
        else
            flag(pt, E.length, string.format("count %d needs %d bytes of values, the datagram has %d", count,
                count * VALUE_LEN, math.max(cap - v0, 0)))
        end
        used = nil
    elseif cap - off == flen + TRAILER_LEN or (cap - off > flen + TRAILER_LEN and frame_at(tvb, off + flen + TRAILER_LEN)) then
        item:add(F.seq, tvb(off + flen, SEQ_LEN))
        item:add(F.tag, tvb(off + flen + SEQ_LEN, TAG_LEN)):append_text(" (not verified: needs the job's key)")
        item:add(F.tagged, true):set_generated()
        used = flen + TRAILER_LEN
    elseif cut and cap - off == flen then
        -- The capture ends with the frame: whether a tag follows on the wire is unknown.
        used = flen
    elseif cap - off == flen or frame_at(tvb, off + flen) then
        local ti = item:add(F.tagged, false)
        ti:set_generated()
        ti:append_text(" (no tag: the frame fills the datagram)")
        used = flen
    else
        flag(item, E.length, string.format("%d bytes after the %d-byte frame: neither a %d-byte trailer (sequence number, tag) nor a next frame",
            cap - off - flen, flen, TRAILER_LEN))
        used = nil
    end
    if used ~= nil then
        item:set_len(used)
        if off + used >= cap then used = nil end
    end
    if cut and (used == nil) and off + flen <= cap then
        flag(item, E.uncaptured, string.format("the capture holds %d of the datagram's %d bytes", cap, total))
    end
    return used, summary(info .. ", " .. nodes)
end

local function dissect_frame(tvb, pinfo, tree, off, seg)
    local item = tree:add(inalab, tvb(off, tvb:len() - off))
    local used, info = dissect_frame_in(tvb, pinfo, item, off, seg)
    item:append_text(": " .. info)
    return used, info
end

local function dissect_datagram(tvb, pinfo, tree)
    pinfo.cols.protocol = "INALAB"
    local off, seg, infos = 0, 0, {}
    while true do
        seg = seg + 1
        local used, info = dissect_frame(tvb, pinfo, tree, off, seg)
        infos[#infos + 1] = info
        if used == nil then break end
        off = off + used
    end
    local info = infos[1]
    if #infos > 1 then
        info = string.format("%s (+%d frames in this datagram)", info, #infos - 1)
        for k = 2, #infos do
            if infos[k]:find("[Malformed", 1, true) then info = string.format("%s; frame %d: %s", info, k, infos[k]) end
        end
    end
    pinfo.cols.info = info
    return tvb:len()
end

function inalab.dissector(tvb, pinfo, tree)
    return dissect_datagram(tvb, pinfo, tree)
end

local function heuristic(tvb, pinfo, tree)
    if tvb:len() < 3 or tvb:reported_len() < ENVELOPE_LEN then return false end
    if tvb(0, 2):uint() ~= MAGIC or tvb(2, 1):uint() ~= VERSION then return false end
    dissect_datagram(tvb, pinfo, tree)
    return true
end
inalab:register_heuristic("udp", heuristic)

local udp_table = DissectorTable.get("udp.port")
udp_table:add_for_decode_as(inalab)
local udp_ports = ""

---------------------------------------------------------------------------------------------
-- The control plane
---------------------------------------------------------------------------------------------

local ctl = Proto("inalab.ctl", "inalab control plane")
local C = {
    line = ProtoField.string("inalab.ctl.line", "JSON line"),
    op = ProtoField.string("inalab.ctl.op", "Request (op)"),
    event = ProtoField.string("inalab.ctl.event", "Event"),
    ok = ProtoField.bool("inalab.ctl.ok", "OK"),
    error = ProtoField.string("inalab.ctl.error", "Error"),
    job = ProtoField.uint32("inalab.ctl.job", "Job"),
    rank = ProtoField.uint32("inalab.ctl.rank", "Rank"),
    world = ProtoField.uint32("inalab.ctl.world", "World size"),
    node = ProtoField.uint32("inalab.ctl.node", "Node", base.DEC_HEX),
    role = ProtoField.string("inalab.ctl.role", "Role"),
    reason = ProtoField.string("inalab.ctl.reason", "Reason"),
    scheme = ProtoField.string("inalab.ctl.scheme", "Scheme"),
}
ctl.fields = C
local CE = {
    bad_json = ProtoExpert.new("inalab.ctl.expert.bad_json", "Not a JSON object", expert.group.MALFORMED, expert.severity.ERROR),
    refused = ProtoExpert.new("inalab.ctl.expert.refused", "Request refused", expert.group.RESPONSE_CODE, expert.severity.WARN),
    event = ProtoExpert.new("inalab.ctl.expert.event", "Failure event", expert.group.SEQUENCE, expert.severity.WARN),
    partial = ProtoExpert.new("inalab.ctl.expert.partial", "Line without its end", expert.group.UNDECODED, expert.severity.NOTE),
}
ctl.experts = { CE.bad_json, CE.refused, CE.event, CE.partial }
ctl.prefs.tcp_ports = Pref.range("TCP ports", "9100,9300",
    "TCP ports of inalab's control plane (the switch's and the PS's control ports by default)", 65535)

-- A small JSON reader: the top-level object's members (strings, numbers, booleans, null;
-- nested objects and arrays as their text), and nested "scheme" members found on the way.
local ESCAPES = { ['"'] = '"', ['\\'] = '\\', ['/'] = '/', b = '\b', f = '\f', n = '\n', r = '\r', t = '\t' }

local function utf8_char(cp)
    if cp >= 0xD800 and cp <= 0xDFFF then return "\239\191\189" end  -- a lone surrogate: U+FFFD
    if cp < 0x80 then return string.char(cp) end
    if cp < 0x800 then return string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64) end
    return string.char(0xE0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
end

-- `s` with every byte that is not part of a well-formed UTF-8 sequence replaced by U+FFFD.
local function clean_utf8(s)
    if not s:find("[\128-\255]") then return s end
    local out, i, n = {}, 1, #s
    while i <= n do
        local c = s:byte(i)
        local len, lo, hi = 0, 0x80, 0xBF
        if c < 0x80 then len = 1
        elseif c >= 0xC2 and c <= 0xDF then len = 2
        elseif c >= 0xE0 and c <= 0xEF then
            len = 3
            if c == 0xE0 then lo = 0xA0 elseif c == 0xED then hi = 0x9F end
        elseif c >= 0xF0 and c <= 0xF4 then
            len = 4
            if c == 0xF0 then lo = 0x90 elseif c == 0xF4 then hi = 0x8F end
        end
        local ok = len > 0 and i + len - 1 <= n
        for k = 1, len - 1 do
            if not ok then break end
            local b = s:byte(i + k)
            if k == 1 then ok = b >= lo and b <= hi else ok = b >= 0x80 and b <= 0xBF end
        end
        if ok then
            out[#out + 1] = s:sub(i, i + len - 1)
            i = i + len
        else
            out[#out + 1] = "\239\191\189"
            i = i + 1
        end
    end
    return table.concat(out)
end

local function skip_ws(s, i)
    return s:find("[^ \t\r\n]", i) or (#s + 1)
end

-- The string starting at s[i] == '"': its text and the index after it, or nil.
local function read_string(s, i)
    local out, j = {}, i + 1
    while true do
        local k = s:find('["\\]', j)
        if k == nil then return nil end
        out[#out + 1] = s:sub(j, k - 1)
        if s:sub(k, k) == '"' then return clean_utf8(table.concat(out)), k + 1 end
        local e = s:sub(k + 1, k + 1)
        if ESCAPES[e] then
            out[#out + 1] = ESCAPES[e]
            j = k + 2
        elseif e == "u" then
            local cp = tonumber(s:sub(k + 2, k + 5), 16)
            if cp == nil or #s:sub(k + 2, k + 5) ~= 4 then return nil end
            out[#out + 1] = utf8_char(cp)
            j = k + 6
        else
            return nil
        end
    end
end

-- The value at s[i]: a Lua value (nested containers as { raw = text }) and the index after it.
local function read_value(s, i, found)
    local c = s:sub(i, i)
    if c == '"' then return read_string(s, i) end
    if c == "{" or c == "[" then
        local depth, j = 0, i
        while true do
            local k = s:find('[%[%]{}"]', j)
            if k == nil then return nil end
            local ch = s:sub(k, k)
            if ch == '"' then
                local str, nxt = read_string(s, k)
                if str == nil then return nil end
                -- A nested "scheme": "NAME" (a join's config, an admit's spec.config).
                if str == "scheme" and found.scheme == nil then
                    local a = skip_ws(s, nxt)
                    if s:sub(a, a) == ":" then
                        local b = skip_ws(s, a + 1)
                        if s:sub(b, b) == '"' then found.scheme = read_string(s, b) end
                    end
                end
                j = nxt
            else
                depth = depth + ((ch == "{" or ch == "[") and 1 or -1)
                j = k + 1
                if depth == 0 then return { raw = s:sub(i, k) }, j end
            end
        end
    end
    local tok = s:match("^[%w%.%+%-]+", i)
    if tok == nil then return nil end
    local v
    if tok == "true" then v = true
    elseif tok == "false" then v = false
    elseif tok == "null" then v = { null = true }
    else v = tonumber(tok) end
    if v == nil then return nil end
    return v, i + #tok
end

-- The top-level members of the JSON object `s` as a table, or nil and why not.
local function read_object(s)
    local found = {}
    local i = skip_ws(s, 1)
    if s:sub(i, i) ~= "{" then return nil, "does not start with {" end
    i = skip_ws(s, i + 1)
    local members = {}
    if s:sub(i, i) == "}" then return members, found end
    while true do
        if s:sub(i, i) ~= '"' then return nil, "expected a member name at byte " .. i end
        local key, v
        key, i = read_string(s, i)
        if key == nil then return nil, "unterminated string" end
        i = skip_ws(s, i)
        if s:sub(i, i) ~= ":" then return nil, "expected : at byte " .. i end
        i = skip_ws(s, i + 1)
        v, i = read_value(s, i, found)
        if v == nil then return nil, "bad value of member " .. key end
        members[key] = v
        i = skip_ws(s, i)
        local c = s:sub(i, i)
        if c == "}" then
            if skip_ws(s, i + 1) <= #s then return nil, "text after the object" end
            return members, found
        end
        if c ~= "," then return nil, "expected , or } at byte " .. i end
        i = skip_ws(s, i + 1)
    end
end

local ok_json, json_dissector = pcall(Dissector.get, "json")
if not ok_json then json_dissector = nil end

local function uint_member(v)
    return type(v) == "number" and v >= 0 and v <= 0xFFFFFFFF and v == math.floor(v)
end

-- One JSON line (`len` bytes at `off`, newline included when `complete`); its Info summary.
local function dissect_line(tvb, pinfo, tree, off, len, complete)
    local text = tvb:raw(off, len):gsub("\r?\n$", "")
    local range = tvb(off, len)
    local lt = tree:add(ctl, range)
    lt:add(C.line, range, clean_utf8(text))
    if not complete then lt:add_proto_expert_info(CE.partial, "the capture ends inside this line") end
    local m, found = read_object(text)
    if m == nil then
        lt:add_proto_expert_info(CE.bad_json, "not a JSON object: " .. found)
        lt:append_text(": malformed line")
        return "[malformed line]"
    end
    local parts = {}
    if type(m.op) == "string" then
        lt:add(C.op, range, m.op)
        parts[#parts + 1] = m.op
    end
    if type(m.event) == "string" then
        lt:add(C.event, range, m.event)
        parts[#parts + 1] = "event " .. m.event
        if m.event == "failed" or m.event == "peer_failed" then
            lt:add_proto_expert_info(CE.event, "event " .. m.event .. (type(m.reason) == "string" and (": " .. m.reason) or ""))
        end
    end
    if type(m.ok) == "boolean" then
        lt:add(C.ok, range, m.ok)
        parts[#parts + 1] = m.ok and "ok" or "refused"
        if not m.ok then
            lt:add_proto_expert_info(CE.refused, "refused: " .. (type(m.error) == "string" and m.error or "no reason given"))
        end
    end
    if type(m.error) == "string" then
        lt:add(C.error, range, m.error)
        parts[#parts + 1] = "error: " .. m.error
    end
    for _, key in ipairs({ "job", "rank", "world", "node" }) do
        if uint_member(m[key]) then
            lt:add(C[key], range, m[key])
            parts[#parts + 1] = string.format("%s=%d", key, m[key])
        end
    end
    if type(m.role) == "string" then
        lt:add(C.role, range, m.role)
        parts[#parts + 1] = "role=" .. m.role
    end
    if found.scheme ~= nil then
        lt:add(C.scheme, range, found.scheme)
        parts[#parts + 1] = "scheme=" .. found.scheme
    end
    if type(m.reason) == "string" then lt:add(C.reason, range, m.reason) end
    if #parts == 0 then parts[1] = "{...}" end
    local info = table.concat(parts, " ")
    lt:append_text(": " .. info)
    if json_dissector ~= nil then
        pcall(function() json_dissector:call(tvb(off, len):tvb(), pinfo, lt) end)
    end
    return info
end

function ctl.dissector(tvb, pinfo, tree)
    local len = tvb:len()
    local off = 0
    local infos = {}
    local data = tvb:raw(0, len)
    while off < len do
        local nl = data:find("\n", off + 1, true)
        if nl == nil then
            if pinfo.can_desegment > 0 and tvb:reported_len() == len then
                -- Ask TCP for the rest of the line.
                pinfo.desegment_offset = off
                pinfo.desegment_len = DESEGMENT_ONE_MORE_SEGMENT
                break
            end
            infos[#infos + 1] = dissect_line(tvb, pinfo, tree, off, len - off, false)
            off = len
        else
            infos[#infos + 1] = dissect_line(tvb, pinfo, tree, off, nl - off, true)
            off = nl
        end
    end
    if #infos > 0 then
        pinfo.cols.protocol = "INALAB-CTL"
        pinfo.cols.info = table.concat(infos, "; ")
    end
    return len
end

local tcp_table = DissectorTable.get("tcp.port")
tcp_table:add_for_decode_as(ctl)
local tcp_ports = ""

local function apply_ports()
    if inalab.prefs.udp_ports ~= udp_ports then
        if udp_ports ~= "" then udp_table:remove(udp_ports, inalab) end
        udp_ports = inalab.prefs.udp_ports
        if udp_ports ~= "" then udp_table:add(udp_ports, inalab) end
    end
    if ctl.prefs.tcp_ports ~= tcp_ports then
        if tcp_ports ~= "" then tcp_table:remove(tcp_ports, ctl) end
        tcp_ports = ctl.prefs.tcp_ports
        if tcp_ports ~= "" then tcp_table:add(tcp_ports, ctl) end
    end
end
inalab.prefs_changed = apply_ports
ctl.prefs_changed = apply_ports
apply_ports()
