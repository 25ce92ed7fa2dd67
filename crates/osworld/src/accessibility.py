# Reads the AT-SPI accessibility tree for drums' OSWorld endpoints
# (/accessibility and /terminal), run by the guest agent as the desktop
# user with /usr/bin/python3. It produces the XML shape of OSWorld's
# server: one element per accessible, named after its role, with states,
# attributes, component, value and action data in the same namespaces. It
# uses only the standard library besides pyatspi, so the image does not
# need lxml.
#
# Prints one JSON object on success; on a missing precondition it prints
# the reason to stderr and exits 3, and the agent answers with an error,
# never with an invented tree.
import json
import os
import sys
import xml.etree.ElementTree as ET

NS = {
    "st": "https://accessibility.ubuntu.example.org/ns/state",
    "attr": "https://accessibility.ubuntu.example.org/ns/attributes",
    "cp": "https://accessibility.ubuntu.example.org/ns/component",
    "doc": "https://accessibility.ubuntu.example.org/ns/document",
    "docattr": "https://accessibility.ubuntu.example.org/ns/document/attributes",
    "txt": "https://accessibility.ubuntu.example.org/ns/text",
    "val": "https://accessibility.ubuntu.example.org/ns/value",
    "act": "https://accessibility.ubuntu.example.org/ns/action",
}
MAX_DEPTH = 50
MAX_WIDTH = 1024


def fail(message):
    sys.stderr.write(message + "\n")
    sys.exit(3)


if not os.environ.get("DBUS_SESSION_BUS_ADDRESS"):
    fail("no DBUS_SESSION_BUS_ADDRESS: AT-SPI is reached through the session bus, and none is configured")
try:
    import pyatspi
except ImportError as e:
    fail("pyatspi is not importable (%s): install python3-pyatspi in the image" % e)

for prefix, uri in NS.items():
    ET.register_namespace(prefix, uri)


def q(ns, name):
    return "{%s}%s" % (NS[ns], name)


def xml_name_ok(name):
    # ElementTree writes any name; a name that is not XML would make the
    # whole document unparsable for the client.
    if not name or not (name[0].isalpha() or name[0] == "_"):
        return False
    return all(c.isalnum() or c in "_-." for c in name)


def node_xml(node, depth):
    attrs = {"name": node.name or ""}
    for st in node.getState().get_states():
        state = pyatspi.StateType._enum_lookup[st].split("_", 1)[1].lower()
        if state:
            attrs[q("st", state)] = "true"
    try:
        for key, value in node.get_attributes().items():
            if xml_name_ok(key):
                attrs[q("attr", key)] = str(value)
    except Exception:
        pass
    if attrs.get(q("st", "visible")) == "true" and attrs.get(q("st", "showing")) == "true":
        try:
            bbox = node.queryComponent().getExtents(pyatspi.XY_SCREEN)
            attrs[q("cp", "screencoord")] = str(tuple(bbox[0:2]))
            attrs[q("cp", "size")] = str(tuple(bbox[2:]))
        except NotImplementedError:
            pass
    text = ""
    try:
        t = node.queryText()
        text = t.getText(0, t.characterCount).replace("\ufffc", "").replace("\ufffd", "")
    except NotImplementedError:
        pass
    try:
        node.queryImage()
        attrs["image"] = "true"
    except NotImplementedError:
        pass
    try:
        node.querySelection()
        attrs["selection"] = "true"
    except NotImplementedError:
        pass
    try:
        value = node.queryValue()
        for key, get in (
            ("value", lambda: value.currentValue),
            ("min", lambda: value.minimumValue),
            ("max", lambda: value.maximumValue),
            ("step", lambda: value.minimumIncrement),
        ):
            try:
                attrs[q("val", key)] = str(get())
            except Exception:
                pass
    except NotImplementedError:
        pass
    try:
        action = node.queryAction()
        for i in range(action.nActions):
            name = action.getName(i).replace(" ", "-")
            if xml_name_ok(name + "_desc"):
                attrs[q("act", name + "_desc")] = action.getDescription(i)
                attrs[q("act", name + "_kb")] = action.getKeyBinding(i)
    except NotImplementedError:
        pass

    role = (node.getRoleName().strip() or "unknown").replace(" ", "-")
    el = ET.Element(role if xml_name_ok(role) else "unknown", attrs)
    if text:
        el.text = text
    if depth == MAX_DEPTH:
        return el
    try:
        for i, child in enumerate(node):
            if i == MAX_WIDTH:
                break
            el.append(node_xml(child, depth + 1))
    except Exception:
        # Apps vanish mid-walk; keep what was read, as the original does.
        pass
    return el


def tree():
    desktop = pyatspi.Registry.getDesktop(0)
    root = ET.Element("desktop-frame")
    for app in desktop:
        root.append(node_xml(app, 1))
    return {"AT": ET.tostring(root, encoding="unicode")}


def has_state(node, state):
    return node.getState().contains(state)


def terminal():
    # The focused terminal of the active gnome-terminal window, if any.
    desktop = pyatspi.Registry.getDesktop(0)
    found = []
    for app in desktop:
        if app.getRoleName() != "application" or app.name != "gnome-terminal-server":
            continue
        for frame in app:
            if frame.getRoleName() != "frame" or not has_state(frame, pyatspi.STATE_ACTIVE):
                continue
            stack = [frame]
            while stack:
                n = stack.pop()
                if n.getRoleName() == "terminal" and has_state(n, pyatspi.STATE_FOCUSED):
                    found.append(n)
                stack.extend(list(n))
    output = None
    if len(found) == 1:
        t = found[0].queryText()
        output = t.getText(0, t.characterCount).rstrip()
    return {"output": output, "status": "success"}


mode = sys.argv[1] if len(sys.argv) > 1 else "tree"
# On a line of its own, last: services the bus activates for us may
# inherit our stdout and print there first.
sys.stdout.write("\n" + json.dumps(tree() if mode == "tree" else terminal()) + "\n")
