"""The scripted notes-quality suite: seeded English and Chinese conversations, labelled.

    .venv/bin/python -m tests.eval.notes_suite --out notes_suite.json [--conversations 12]

Every conversation is generated from templates with a seed (`random.Random`, no other source of
randomness, so one seed gives one file). Each user turn that carries something a continuing task
needs is a must-keep item with its kind (name, code, id, amount, date, preference, health,
constraint, decision, open, commitment, deadline) and key terms; decisions are later changed and
some codes updated (`supersedes`: the earlier versions must be gone from the notes). Questions,
requests, chit-chat and the assistant's replies are labelled non-facts: nothing they say belongs in
the notes. Filler pushes the conversation well past any small window.

Held-out part: every template list and filler pool is shuffled with a fixed seed and its last third
is held out. `dev` conversations use the first two thirds only, `heldout` conversations only the
held-out third, each with their own seeds; the notes rules were written against `dev` only and
both parts are reported.

The JSON is read by `contextd eval notes --suite FILE` (`app.eval.notes`).
"""

import argparse
import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Language = Literal["en", "zh"]
Split = Literal["dev", "heldout"]
SPLIT_SEED = 14
HELDOUT_SEED_BASE = 10_000

# ---------------------------------------------------------------- value pools (shared by splits)

EN_FIRST = [
    "Maria",
    "James",
    "Aisha",
    "Tom",
    "Elena",
    "Kwame",
    "Sofia",
    "Lucas",
    "Nina",
    "Omar",
    "Grace",
    "Henrik",
    "Priya",
    "Diego",
    "Hannah",
    "Yusuf",
]
EN_LAST = [
    "Lopez",
    "Whitaker",
    "Okafor",
    "Brennan",
    "Novak",
    "Mensah",
    "Rossi",
    "Fischer",
    "Lindqvist",
    "Haddad",
    "Kowalski",
    "Delgado",
    "Thornton",
    "Iyer",
    "Moreau",
    "Carver",
]
ZH_SURNAME = [
    "王",
    "李",
    "张",
    "刘",
    "陈",
    "杨",
    "黄",
    "赵",
    "周",
    "吴",
    "徐",
    "孙",
    "马",
    "胡",
    "郭",
    "林",
    "何",
    "高",
    "罗",
    "郑",
]
ZH_GIVEN = [
    "晓明",
    "丽娜",
    "建国",
    "雨桐",
    "子涵",
    "思远",
    "婉清",
    "浩然",
    "欣怡",
    "志强",
    "梦琪",
    "俊杰",
    "静",
    "磊",
    "芳",
    "伟",
]
EN_RELATION = ["daughter", "son", "wife", "husband", "mother", "partner"]
ZH_RELATION = ["女儿", "儿子", "老婆", "老公", "妈妈", "爸爸"]
ALLERGEN_EN = ["peanuts", "shellfish", "penicillin", "gluten", "sesame", "latex", "eggs", "kiwi"]
ALLERGEN_ZH = ["花生", "海鲜", "青霉素", "芒果", "鸡蛋", "牛奶", "坚果", "猕猴桃"]
CONDITION_EN = ["lactose intolerant", "diabetic", "asthmatic", "pregnant"]
CONDITION_ZH = ["乳糖不耐受", "糖尿病", "高血压", "哮喘"]
PREFER_EN = [
    "aisle seats",
    "window seats",
    "morning deliveries",
    "email updates",
    "paper invoices",
    "quiet rooms",
    "oat milk",
    "vegetarian meals",
    "text messages",
    "evening appointments",
]
DISLIKE_EN = [
    "phone calls",
    "spicy food",
    "cilantro",
    "plastic packaging",
    "early flights",
    "carpeted rooms",
]
PREFER_ZH = [
    "靠窗的座位",
    "上午送货",
    "邮件联系",
    "纸质发票",
    "安静的房间",
    "燕麦奶",
    "素食",
    "短信通知",
    "晚上的预约",
    "高铁出行",
]
DISLIKE_ZH = ["香菜", "辣的菜", "塑料包装", "电话联系", "早班飞机", "地毯房"]
OPTIONS_EN = {
    "shipping": ["express shipping", "standard shipping", "same-day courier", "pickup in store"],
    "color": ["the graphite one", "the silver one", "the navy one", "the olive one"],
    "hotel": ["the Marriott", "the Hilton", "the Ibis", "the Novotel"],
    "payment": ["credit card", "PayPal", "bank transfer", "cash on delivery"],
    "plan": ["the monthly plan", "the annual plan", "the family plan", "the student plan"],
    "venue": ["the rooftop bar", "the Italian place", "the garden terrace", "the hotel lobby"],
}
OPTIONS_ZH = {
    "配送方式": ["顺丰", "京东快递", "中通快递", "门店自提"],
    "颜色": ["黑色款", "银色款", "蓝色款", "绿色款"],
    "酒店": ["全季酒店", "汉庭酒店", "亚朵酒店", "如家酒店"],
    "付款方式": ["支付宝", "微信支付", "银行转账", "货到付款"],
    "套餐": ["月付套餐", "年付套餐", "家庭套餐", "学生套餐"],
    "聚餐地点": ["川菜馆", "日料店", "火锅店", "西餐厅"],
}
TOPIC_EN = [
    ("the hotel has parking", "parking"),
    ("my passport arrives in time", "passport"),
    ("the warranty covers water damage", "warranty"),
    ("we need a visa for the layover", "visa"),
    ("the venue allows pets", "pets"),
    ("the invoice needs a VAT number", "VAT"),
]
TOPIC_ZH = [
    ("酒店有没有停车位", "停车位"),
    ("护照能不能及时办好", "护照"),
    ("保修是否包括进水", "保修"),
    ("转机要不要签证", "签证"),
    ("场地能不能带宠物", "宠物"),
    ("发票要不要税号", "税号"),
]
THING_EN = [
    ("the signed form", "signed form"),
    ("the receipts", "receipts"),
    ("the floor plan", "floor plan"),
    ("the ID scan", "ID scan"),
    ("the guest list", "guest list"),
]
THING_ZH = [
    ("签好的表格", "表格"),
    ("发票照片", "发票照片"),
    ("户型图", "户型图"),
    ("身份证扫描件", "身份证"),
    ("宾客名单", "宾客名单"),
]
WEEKDAY_EN = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
WEEKDAY_ZH = ["周一", "周二", "周三", "周四", "周五", "下周一", "下周三"]
MONTH_EN = ["March", "April", "May", "June", "July", "September", "October", "November"]


def en_date(rng: random.Random) -> str:
    month, day = rng.choice(MONTH_EN), rng.randint(2, 28)
    forms = [f"{month} {day}", f"{day} {month}", f"2025-{MONTH_EN.index(month) + 3:02d}-{day:02d}"]
    return rng.choice(forms)


def zh_date(rng: random.Random) -> str:
    month, day = rng.randint(1, 12), rng.randint(1, 28)
    return rng.choice([f"{month}月{day}日", f"{month}月{day}号", f"2025年{month}月{day}日"])


def en_amount(rng: random.Random) -> str:
    value = rng.choice([49, 89, 149, 230, 480, 1250, 2999])
    return rng.choice([f"${value}.99", f"{value} EUR", f"£{value:,}", f"{value} dollars"])


def zh_amount(rng: random.Random) -> str:
    value = rng.choice([89, 349, 1280, 3500, 6800, 12000])
    return rng.choice([f"{value}元", f"¥{value}", f"{value}块"])


def code(rng: random.Random) -> str:
    digits = "".join(rng.choice("0123456789") for _ in range(rng.choice([4, 4, 5, 6])))
    return rng.choice([digits, digits, f"{digits}#", f"*{digits}"])


def order_id(rng: random.Random) -> str:
    n = rng.randint(10_000, 99_999)
    return rng.choice([f"A-{n}", f"OD-2025-{n}", f"{n}{rng.randint(10, 99)}", f"WX{n}{n % 97}"])


def tracking(rng: random.Random) -> str:
    digits = "".join(rng.choice("0123456789") for _ in range(12))
    return rng.choice(
        [f"1Z9{digits[:3]}E8{digits}", f"SF{digits}", f"TBA{digits}", f"YT{digits[:10]}"]
    )


def ref_code(rng: random.Random) -> str:
    letters = "ABCDEFGHJKLMNPQRSTUVWXYZ"
    chars = [
        rng.choice(letters),
        str(rng.randint(2, 9)),
        rng.choice(letters),
        rng.choice(letters),
        str(rng.randint(2, 9)),
        rng.choice(letters),
    ]
    return "".join(chars)


# ---------------------------------------------------------------- templates
# A template is (text, key terms); both may name slots in braces. Lists are split dev/held-out.

TEMPLATES: dict[tuple[Language, str], list[tuple[str, tuple[str, ...]]]] = {
    ("en", "name"): [
        ("Hi, my name is {first} {last}.", ("{first} {last}",)),
        ("Hello, this is {first} {last} speaking.", ("{first} {last}",)),
        ("I'm {first} {last}, I placed an order last week.", ("{first} {last}",)),
        ("{first} {last} here, following up on my request.", ("{first} {last}",)),
        ("My name's {first} {last}.", ("{first} {last}",)),
        ("The name on the account is {first} {last}.", ("{first} {last}",)),
        ("Sorry, I should have introduced myself: I am {first} {last}.", ("{first} {last}",)),
        ("You can call me {first}, full name {first} {last}.", ("{first} {last}",)),
        ("My {relation}'s name is {first}.", ("{relation}", "{first}")),
    ],
    ("zh", "name"): [
        ("你好，我叫{full}。", ("{full}",)),
        ("我是{full}，上周下的单。", ("{full}",)),
        ("我的名字是{full}。", ("{full}",)),
        ("本人{full}，想咨询一下订单。", ("{full}",)),
        ("您好，我是{full}。", ("{full}",)),
        ("收件人是{full}。", ("{full}",)),
        ("叫我{given}就行，全名{full}。", ("{full}",)),
        ("我姓{surname}，叫{full}。", ("{full}",)),
        ("我{relation}叫{full}。", ("{relation}", "{full}")),
    ],
    ("en", "code"): [
        ("The gate code is {code}.", ("{code_digits}",)),
        ("Door code for the building: {code}.", ("{code_digits}",)),
        ("To get in, use the door code {code}.", ("{code_digits}",)),
        ("The entry PIN for the lobby is {code}.", ("{code_digits}",)),
        ("The keypad code at the back door is {code}.", ("{code_digits}",)),
        ("Locker code: {code}.", ("{code_digits}",)),
        ("Buzz {code} at the front gate to get in.", ("{code_digits}",)),
        ("The garage passcode is {code}, the courier will need it.", ("{code_digits}",)),
        ("Access code for the parking lot is {code}.", ("{code_digits}",)),
    ],
    ("zh", "code"): [
        ("门禁密码是{code}。", ("{code_digits}",)),
        ("小区大门密码：{code}。", ("{code_digits}",)),
        ("进门按{code}就行。", ("{code_digits}",)),
        ("大门的门禁码是{code}。", ("{code_digits}",)),
        ("快递柜取件码{code}。", ("{code_digits}",)),
        ("单元门密码是{code}，送到家门口。", ("{code_digits}",)),
        ("楼下的密码锁是{code}。", ("{code_digits}",)),
        ("车库的开门密码是{code}，快递员要用。", ("{code_digits}",)),
        ("停车场的通行码是{code}。", ("{code_digits}",)),
    ],
    ("en", "code_update"): [
        ("The gate code changed, it's {code2} now.", ("{code2_digits}",)),
        ("Update: the door code is now {code2}.", ("{code2_digits}",)),
        ("They reset the code, the new one is {code2}.", ("{code2_digits}",)),
        ("Correction, the code is {code2}, not the old one.", ("{code2_digits}",)),
        ("New gate code from today: {code2}.", ("{code2_digits}",)),
        ("Please use {code2} as the door code from now on.", ("{code2_digits}",)),
    ],
    ("zh", "code_update"): [
        ("门禁密码改了，现在是{code2}。", ("{code2_digits}",)),
        ("更新一下：大门密码现在是{code2}。", ("{code2_digits}",)),
        ("密码重置了，新的是{code2}。", ("{code2_digits}",)),
        ("更正，密码是{code2}，不是之前那个。", ("{code2_digits}",)),
        ("从今天起门禁码换成{code2}。", ("{code2_digits}",)),
        ("以后门禁密码用{code2}。", ("{code2_digits}",)),
    ],
    ("en", "id"): [
        ("My order number is {order}.", ("{order}",)),
        ("The order ID is {order}, placed on Monday.", ("{order}",)),
        ("Here's the tracking number: {tracking}.", ("{tracking}",)),
        ("Tracking: {tracking}", ("{tracking}",)),
        ("The confirmation code for the booking is {ref}.", ("{ref}",)),
        ("It's order {order}, could you check where it is?", ("{order}",)),
        ("The parcel went out with tracking number {tracking}.", ("{tracking}",)),
        ("My membership number is {member}.", ("{member}",)),
        ("Case number {order} was opened yesterday.", ("{order}",)),
        ("Booking reference {ref}, under my name.", ("{ref}",)),
        ("The invoice number on the receipt is {order}.", ("{order}",)),
        ("The courier gave me the waybill {tracking}.", ("{tracking}",)),
    ],
    ("zh", "id"): [
        ("订单号是{order}。", ("{order}",)),
        ("我的订单号：{order}。", ("{order}",)),
        ("快递单号{tracking}。", ("{tracking}",)),
        ("运单号是{tracking}，麻烦查一下。", ("{tracking}",)),
        ("预订确认号是{ref}。", ("{ref}",)),
        ("会员号{member}。", ("{member}",)),
        ("物流单号：{tracking}", ("{tracking}",)),
        ("工单号是{order}，昨天提交的。", ("{order}",)),
        ("发票号码是{order}。", ("{order}",)),
        ("我下的单是{order}，帮我看看到哪了？", ("{order}",)),
        ("取件的单号是{tracking}。", ("{tracking}",)),
        ("预约编号{ref}，用的我的名字。", ("{ref}",)),
    ],
    ("en", "amount"): [
        ("The refund should be {amount}.", ("{amount_value}",)),
        ("I paid {amount} for it.", ("{amount_value}",)),
        ("Total was {amount} including shipping.", ("{amount_value}",)),
        ("They charged me {amount} twice.", ("{amount_value}",)),
        ("The deposit is {amount}.", ("{amount_value}",)),
        ("The quote you sent says {amount}.", ("{amount_value}",)),
        ("The repair will cost {amount} according to the shop.", ("{amount_value}",)),
        ("My card was billed {amount} on the 3rd.", ("{amount_value}",)),
        ("The agreed price is {amount}.", ("{amount_value}",)),
    ],
    ("zh", "amount"): [
        ("退款金额是{amount}。", ("{amount_value}",)),
        ("我付了{amount}。", ("{amount_value}",)),
        ("总共{amount}，含运费。", ("{amount_value}",)),
        ("定金交了{amount}。", ("{amount_value}",)),
        ("被扣了两次{amount}。", ("{amount_value}",)),
        ("报价单上写的是{amount}。", ("{amount_value}",)),
        ("维修费要{amount}，店里说的。", ("{amount_value}",)),
        ("信用卡3号扣了{amount}。", ("{amount_value}",)),
        ("说好的价格是{amount}。", ("{amount_value}",)),
    ],
    ("en", "date"): [
        ("The delivery date is {date}.", ("{date}",)),
        ("My appointment is on {date}.", ("{date}",)),
        ("We check in on {date}.", ("{date}",)),
        ("The package is supposed to arrive on {date}.", ("{date}",)),
        ("The event is scheduled for {date}.", ("{date}",)),
        ("Our flight leaves on {date}.", ("{date}",)),
        ("The installation is booked for {date}.", ("{date}",)),
        ("I move into the new flat on {date}.", ("{date}",)),
        ("The wedding is on {date}.", ("{date}",)),
    ],
    ("zh", "date"): [
        ("送货日期是{date}。", ("{date}",)),
        ("预约在{date}。", ("{date}",)),
        ("我们{date}入住。", ("{date}",)),
        ("包裹应该{date}到。", ("{date}",)),
        ("活动定在{date}。", ("{date}",)),
        ("航班是{date}的。", ("{date}",)),
        ("安装约的是{date}。", ("{date}",)),
        ("我{date}搬新家。", ("{date}",)),
        ("婚礼在{date}举行。", ("{date}",)),
    ],
    ("en", "preference"): [
        ("I prefer {prefer}.", ("{prefer_key}",)),
        ("I'd rather have {prefer}.", ("{prefer_key}",)),
        ("I really like {prefer}.", ("{prefer_key}",)),
        ("Please no {dislike}, I can't stand them.", ("{dislike_key}",)),
        ("I don't like {dislike}.", ("{dislike_key}",)),
        ("My favourite is {prefer}.", ("{prefer_key}",)),
        ("We always go for {prefer}.", ("{prefer_key}",)),
        ("I hate {dislike}, avoid them if you can.", ("{dislike_key}",)),
        ("If possible I'd like {prefer}.", ("{prefer_key}",)),
    ],
    ("zh", "preference"): [
        ("我喜欢{prefer}。", ("{prefer}",)),
        ("我比较喜欢{prefer}。", ("{prefer}",)),
        ("我更喜欢{prefer}。", ("{prefer}",)),
        ("不要{dislike}。", ("{dislike}",)),
        ("我不喜欢{dislike}。", ("{dislike}",)),
        ("最好是{prefer}。", ("{prefer}",)),
        ("我们一般选{prefer}。", ("{prefer}",)),
        ("我讨厌{dislike}，尽量避免。", ("{dislike}",)),
        ("我偏好{prefer}。", ("{prefer}",)),
    ],
    ("en", "health"): [
        ("I'm allergic to {allergen}.", ("{allergen}",)),
        ("My {relation} has a {allergen_one} allergy.", ("{allergen_one}",)),
        ("My {relation} is allergic to {allergen}, so please be careful.", ("{allergen}",)),
        ("I have a severe {allergen_one} allergy.", ("{allergen_one}",)),
        ("I'm {condition}, just so you know.", ("{condition}",)),
        ("No {allergen} please, I'm allergic.", ("{allergen}",)),
        ("Heads up: my {relation} is {condition}.", ("{condition}",)),
        ("I react badly to {allergen}, it's an allergy.", ("{allergen}",)),
        ("We have a {allergen_one} allergy in the family.", ("{allergen_one}",)),
    ],
    ("zh", "health"): [
        ("我对{allergen}过敏。", ("{allergen}",)),
        ("我{relation}对{allergen}过敏。", ("{allergen}",)),
        ("孩子{allergen}过敏，请注意。", ("{allergen}",)),
        ("我有{allergen}过敏史。", ("{allergen}",)),
        ("我有{condition}。", ("{condition}",)),
        ("我不能吃{allergen}，会过敏。", ("{allergen}",)),
        ("提醒一下，我{relation}有{condition}。", ("{condition}",)),
        ("我{relation}对{allergen}严重过敏。", ("{allergen}",)),
        ("家里有人{allergen}过敏。", ("{allergen}",)),
    ],
    ("en", "constraint"): [
        ("The budget must not exceed {limit}.", ("{limit_value}",)),
        ("Never call me before {hour} am.", ("{hour} am",)),
        ("Don't leave the package at the door.", ("package", "door")),
        ("We can only do weekends.", ("weekends",)),
        ("At most {n} people will come.", ("{n} people",)),
        ("It must be delivered to the back entrance.", ("back entrance",)),
        ("Please do not ring the doorbell, the baby sleeps.", ("doorbell",)),
        ("Keep the total under {limit}.", ("{limit_value}",)),
        ("No deliveries after {hour} pm, I'm not home then.", ("{hour} pm",)),
    ],
    ("zh", "constraint"): [
        ("预算不能超过{limit}。", ("{limit_value}",)),
        ("千万别在早上{hour}点之前打电话。", ("{hour}点",)),
        ("包裹不要放在门口。", ("包裹", "门口")),
        ("只能周末送货。", ("周末",)),
        ("最多{n}个人。", ("{n}个人",)),
        ("必须送到后门。", ("后门",)),
        ("请不要按门铃，孩子在睡觉。", ("门铃",)),
        ("价格控制在{limit}以内。", ("{limit_value}",)),
        ("晚上{hour}点以后不要送货，我不在家。", ("{hour}点",)),
    ],
    ("en", "decision"): [
        ("Let's go with {opt} for the {slot}.", ("{opt_key}",)),
        ("For the {slot}, we'll use {opt}.", ("{opt_key}",)),
        ("I've decided on {opt} for the {slot}.", ("{opt_key}",)),
        ("OK, {opt} it is for the {slot}.", ("{opt_key}",)),
        ("We'll take {opt} as the {slot}.", ("{opt_key}",)),
        ("Go with {opt} for the {slot}.", ("{opt_key}",)),
        ("Decision on the {slot}: {opt}.", ("{opt_key}",)),
        ("I choose {opt} for the {slot}.", ("{opt_key}",)),
        ("Book {opt} for the {slot}, please.", ("{opt_key}",)),
    ],
    ("zh", "decision"): [
        ("{slot}就用{opt}吧。", ("{opt}",)),
        ("{slot}决定选{opt}。", ("{opt}",)),
        ("那{slot}就{opt}了。", ("{opt}",)),
        ("我们{slot}选{opt}。", ("{opt}",)),
        ("{slot}定{opt}。", ("{opt}",)),
        ("{slot}采用{opt}。", ("{opt}",)),
        ("{slot}确定用{opt}。", ("{opt}",)),
        ("{slot}就选{opt}，别的不考虑了。", ("{opt}",)),
        ("{slot}按{opt}来。", ("{opt}",)),
    ],
    ("en", "decision_change"): [
        ("Actually, switch the {slot} to {opt2}.", ("{opt2_key}",)),
        ("Change of plan: {opt2} for the {slot} instead.", ("{opt2_key}",)),
        ("Forget {opt}, let's do {opt2}.", ("{opt2_key}",)),
        ("Not {opt} anymore, {opt2} for the {slot}.", ("{opt2_key}",)),
        ("On second thought, I want {opt2} for the {slot}.", ("{opt2_key}",)),
        ("Make the {slot} {opt2} instead.", ("{opt2_key}",)),
        ("Scratch that, the {slot} will be {opt2}.", ("{opt2_key}",)),
        ("I changed my mind about the {slot}: {opt2}.", ("{opt2_key}",)),
        ("Let's use {opt2} instead of {opt}.", ("{opt2_key}",)),
    ],
    ("zh", "decision_change"): [
        ("{slot}改成{opt2}吧。", ("{opt2}",)),
        ("不要{opt}了，换成{opt2}。", ("{opt2}",)),
        ("{slot}还是用{opt2}吧。", ("{opt2}",)),
        ("算了，{slot}换{opt2}。", ("{opt2}",)),
        ("我改主意了，{slot}要{opt2}。", ("{opt2}",)),
        ("{opt}不要了，{slot}用{opt2}。", ("{opt2}",)),
        ("{slot}改为{opt2}。", ("{opt2}",)),
        ("换一下，{slot}用{opt2}，不用{opt}了。", ("{opt2}",)),
        ("最后决定{slot}用{opt2}。", ("{opt2}",)),
    ],
    ("en", "open"): [
        ("I still need to find out whether {topic}.", ("{topic_key}",)),
        ("Open question: whether {topic}.", ("{topic_key}",)),
        ("Not sure yet if {topic}, I'll let you know.", ("{topic_key}",)),
        ("We haven't decided whether {topic}.", ("{topic_key}",)),
        ("Still to figure out: whether {topic}.", ("{topic_key}",)),
        ("Something to check later: whether {topic}.", ("{topic_key}",)),
        ("It's still unclear whether {topic}.", ("{topic_key}",)),
        ("TBD whether {topic}.", ("{topic_key}",)),
        ("I'm waiting to hear whether {topic}.", ("{topic_key}",)),
    ],
    ("zh", "open"): [
        ("还没确定{topic}。", ("{topic_key}",)),
        ("待确认：{topic}。", ("{topic_key}",)),
        ("我还需要问一下{topic}。", ("{topic_key}",)),
        ("{topic}，这个还不确定。", ("{topic_key}",)),
        ("回头再确认{topic}。", ("{topic_key}",)),
        ("{topic}还要再查一下。", ("{topic_key}",)),
        ("目前还不清楚{topic}。", ("{topic_key}",)),
        ("{topic}待定。", ("{topic_key}",)),
        ("我在等消息，看{topic}。", ("{topic_key}",)),
    ],
    ("en", "commitment"): [
        ("I'll send you {thing} by {weekday}.", ("{thing_key}", "{weekday}")),
        ("I will upload {thing} before {weekday}.", ("{thing_key}", "{weekday}")),
        ("I promise to email {thing} by {by}.", ("{thing_key}", "{by}")),
        ("I'll get {thing} to you on {weekday}.", ("{thing_key}", "{weekday}")),
        ("Expect {thing} from me by {by}.", ("{thing_key}", "{by}")),
        ("I'm going to post {thing} on {weekday}.", ("{thing_key}", "{weekday}")),
        ("You'll have {thing} by {weekday}, I promise.", ("{thing_key}", "{weekday}")),
        ("I will bring {thing} on {by}.", ("{thing_key}", "{by}")),
        ("I'll drop off {thing} before {weekday}.", ("{thing_key}", "{weekday}")),
    ],
    ("zh", "commitment"): [
        ("我{weekday}之前把{thing}发给你。", ("{thing_key}", "{weekday}")),
        ("我会在{by}前上传{thing}。", ("{thing_key}", "{by}")),
        ("{thing}我{weekday}发过去。", ("{thing_key}", "{weekday}")),
        ("我答应{by}把{thing}寄给你们。", ("{thing_key}", "{by}")),
        ("最晚{weekday}我把{thing}给你。", ("{thing_key}", "{weekday}")),
        ("我{weekday}去送{thing}。", ("{thing_key}", "{weekday}")),
        ("{thing}我保证{by}之前交。", ("{thing_key}", "{by}")),
        ("我{by}带{thing}过来。", ("{thing_key}", "{by}")),
        ("我会在{weekday}前把{thing}送到。", ("{thing_key}", "{weekday}")),
    ],
    ("en", "deadline"): [
        ("The report is due on {due}.", ("{due}",)),
        ("Deadline for the payment is {due}.", ("{due}",)),
        ("Everything has to be finished by {weekday}.", ("{weekday}",)),
        ("The application closes on {due}.", ("{due}",)),
        ("We need the documents no later than {due}.", ("{due}",)),
        ("The last day to cancel is {due}.", ("{due}",)),
        ("Payment is due {weekday} at the latest.", ("{weekday}",)),
        ("The form must be submitted before {due}.", ("{due}",)),
        ("The cutoff for changes is {due}.", ("{due}",)),
    ],
    ("zh", "deadline"): [
        ("报告{due}截止。", ("{due}",)),
        ("付款截止日期是{due}。", ("{due}",)),
        ("最晚{weekday}要全部完成。", ("{weekday}",)),
        ("申请{due}关闭。", ("{due}",)),
        ("材料必须在{due}之前交。", ("{due}",)),
        ("取消的最后期限是{due}。", ("{due}",)),
        ("尾款最迟{weekday}付清。", ("{weekday}",)),
        ("表格要在{due}前提交。", ("{due}",)),
        ("修改的截止时间是{due}。", ("{due}",)),
    ],
}

# Non-facts: nothing in them belongs in the notes.
NONFACTS: dict[tuple[Language, str], list[str]] = {
    ("en", "question"): [
        "Can you tell me more about the return policy?",
        "Question {n}: how long does shipping usually take?",
        "What are your opening hours?",
        "Do you ship to Canada?",
        "How does the warranty work?",
        "Is there a discount for students?",
        "Could you explain how refunds are processed?",
        "What's the difference between the two plans?",
        "Why is the delivery taking so long?",
        "How much does express shipping cost?",
        "Where can I find the user manual?",
        "Do you have this in a larger size?",
        "Is it possible to change the address after ordering?",
        "Question {n}: do you offer gift wrapping?",
        "What happens if nobody is home at delivery?",
    ],
    ("zh", "question"): [
        "能介绍一下退货政策吗？",
        "问题{n}：一般多久能发货？",
        "你们几点下班？",
        "可以寄到香港吗？",
        "保修是怎么算的？",
        "学生有优惠吗？",
        "退款一般要多久？",
        "两个套餐有什么区别？",
        "为什么物流这么慢？",
        "加急配送多少钱？",
        "说明书在哪里下载？",
        "这个有大一号的吗？",
        "下单后还能改地址吗？",
        "问题{n}：可以开发票吗？",
        "送货时家里没人怎么办？",
    ],
    ("en", "request"): [
        "Please check the status for me.",
        "Could you look that up?",
        "Please send me the link again.",
        "Can you resend the confirmation email?",
        "Help me compare the two options.",
        "Please explain that again more simply.",
        "Show me the cheapest option.",
        "Remind me what we discussed about shipping.",
        "Give me a summary of the options.",
    ],
    ("zh", "request"): [
        "帮我查一下物流。",
        "麻烦再发一次链接。",
        "请帮我看看。",
        "能重新发一下确认邮件吗？",
        "帮我比较一下这两个方案。",
        "再解释一遍吧。",
        "给我看看最便宜的。",
        "提醒我一下之前说的配送的事。",
        "帮我总结一下这几个选项。",
    ],
    ("en", "chitchat"): [
        "Thanks a lot!",
        "Haha, that's funny.",
        "Ok, got it.",
        "Great, thanks for your patience.",
        "Sorry for the long message earlier.",
        "The weather is lovely today.",
        "I've been waiting for {n} minutes, haha.",
        "Have a nice weekend!",
        "You're very helpful.",
        "Hmm, let me think.",
        "Cool.",
        "I just got back from a {n} km run, so excuse the typos.",
        "My cat just walked over the keyboard, sorry.",
        "Good morning!",
        "That makes sense, thank you.",
    ],
    ("zh", "chitchat"): [
        "谢谢！",
        "哈哈，好的。",
        "明白了。",
        "辛苦了。",
        "今天天气真好。",
        "我都等了{n}分钟了，哈哈。",
        "周末愉快！",
        "你们服务真好。",
        "嗯，我想想。",
        "好的好的。",
        "刚跑完{n}公里，打字有点慢。",
        "猫刚踩到键盘了，不好意思。",
        "早上好！",
        "有道理，谢谢。",
        "太棒了。",
    ],
    ("en", "reply"): [
        "Got it, thanks.",
        "Noted.",
        "Sure, let me check.",
        "Thanks for letting me know.",
        "I understand.",
        "Happy to help!",
        "Of course.",
        "Let me look into it.",
        "Our return window is 30 days from delivery.",
        "Standard shipping usually takes 3-5 business days.",
        "Yes, we ship internationally.",
        "Your parcel is probably on its way already.",
        "The warranty lasts 2 years for most products.",
        "That should be fine.",
        "Good question, here is how it works: you fill in the form and we handle the rest.",
    ],
    ("zh", "reply"): [
        "好的，收到。",
        "明白。",
        "我帮您查一下。",
        "感谢告知。",
        "没问题。",
        "退货期限是签收后7天内。",
        "一般3到5个工作日发货。",
        "您的包裹可能已经在路上了。",
        "保修期一般是两年。",
        "这样应该没问题。",
        "好问题，流程是先填表，然后我们来处理。",
        "了解，我记下了。",
        "请稍等。",
        "可以的。",
        "我们会尽快处理。",
    ],
}
LEAD_INS: dict[Language, list[str]] = {
    "en": ["", "", "", "Oh, and ", "By the way, ", "Also, ", "One more thing: "],
    "zh": ["", "", "", "对了，", "另外，", "还有，", "顺便说一下，"],
}
KINDS = ("name", "code", "id", "amount", "date", "preference", "health", "constraint",
         "decision", "open", "commitment", "deadline")  # fmt: skip


def split_of(items: Sequence[Any], split: Split) -> list[Any]:
    """The dev two thirds or the held-out third of a list, after a fixed shuffle."""
    order = list(range(len(items)))
    random.Random(f"{SPLIT_SEED}:{len(items)}:{items[0]!r}").shuffle(order)
    cut = len(items) - max(1, len(items) // 3)
    chosen = order[:cut] if split == "dev" else order[cut:]
    return [items[i] for i in sorted(chosen)]


# ---------------------------------------------------------------- generation


@dataclass
class _Turn:
    role: str
    content: str
    label: str  # keep | question | request | chitchat | reply


def _slots(rng: random.Random, lang: Language) -> dict[str, str]:
    """One draw of every slot value for one conversation."""
    if lang == "en":
        first, last = rng.choice(EN_FIRST), rng.choice(EN_LAST)
        slot = rng.choice(sorted(OPTIONS_EN))
        prefer, dislike = rng.choice(PREFER_EN), rng.choice(DISLIKE_EN)
        topic, topic_key = rng.choice(TOPIC_EN)
        thing, thing_key = rng.choice(THING_EN)
        allergen = rng.choice(ALLERGEN_EN)
        amount, limit = en_amount(rng), en_amount(rng)
        values = {
            "first": first, "last": last, "relation": rng.choice(EN_RELATION),
            "allergen": allergen, "allergen_one": allergen.removesuffix("s"),
            "condition": rng.choice(CONDITION_EN), "prefer": prefer,
            "prefer_key": prefer.split()[0], "dislike": dislike, "dislike_key": dislike.split()[0],
            "date": en_date(rng), "due": en_date(rng), "by": en_date(rng),
            "weekday": rng.choice(WEEKDAY_EN), "amount": amount, "limit": limit, "slot": slot,
            "topic": topic, "topic_key": topic_key, "thing": thing, "thing_key": thing_key,
            "hour": str(rng.randint(7, 10)),
        }  # fmt: skip
    else:
        surname, given = rng.choice(ZH_SURNAME), rng.choice(ZH_GIVEN)
        slot = rng.choice(sorted(OPTIONS_ZH))
        topic, topic_key = rng.choice(TOPIC_ZH)
        thing, thing_key = rng.choice(THING_ZH)
        amount, limit = zh_amount(rng), zh_amount(rng)
        values = {
            "surname": surname, "given": given, "full": surname + given,
            "relation": rng.choice(ZH_RELATION), "allergen": rng.choice(ALLERGEN_ZH),
            "condition": rng.choice(CONDITION_ZH), "prefer": rng.choice(PREFER_ZH),
            "dislike": rng.choice(DISLIKE_ZH), "date": zh_date(rng), "due": zh_date(rng),
            "by": zh_date(rng), "weekday": rng.choice(WEEKDAY_ZH), "amount": amount,
            "limit": limit, "slot": slot, "topic": topic, "topic_key": topic_key, "thing": thing,
            "thing_key": thing_key, "hour": str(rng.randint(7, 10)),
        }  # fmt: skip
    _set_options(values, *rng.sample((OPTIONS_EN if lang == "en" else OPTIONS_ZH)[slot], 2))
    code1, code2 = code(rng), code(rng)
    while code2.strip("#*") == code1.strip("#*"):
        code2 = code(rng)
    values |= {"n": str(rng.randint(2, 9))}
    _set_codes(values, code1, code2)
    _new_ids(rng, values)
    for name in ("amount", "limit"):
        number = re.search(r"\d[\d,]*(?:\.\d+)?", values[name])
        assert number is not None
        values[f"{name}_value"] = number.group(0)  # as written: "1,250"
    return values


def _new_ids(rng: random.Random, values: dict[str, str]) -> None:
    values |= {"order": order_id(rng), "tracking": tracking(rng), "ref": ref_code(rng),
               "member": str(rng.randint(10_000_000, 99_999_999))}  # fmt: skip


def _set_codes(values: dict[str, str], code1: str, code2: str) -> None:
    values |= {"code": code1, "code2": code2, "code_digits": code1.strip("#*"),
               "code2_digits": code2.strip("#*")}  # fmt: skip


def _set_options(values: dict[str, str], opt: str, opt2: str) -> None:
    """The decided option and the one it is changed to (English keys drop "the")."""
    values |= {"opt": opt, "opt2": opt2, "opt_key": opt.removeprefix("the ").split()[0],
               "opt2_key": opt2.removeprefix("the ").split()[0]}  # fmt: skip


def _fill(template: str, values: dict[str, str]) -> str:
    return template.format(**values)


def generate_conversation(lang: Language, split: Split, seed: int) -> dict[str, Any]:
    """One labelled conversation: must-keep items among non-facts and filler, ~110-140 turns."""
    rng = random.Random(f"notes-suite:{lang}:{split}:{seed}")
    values = _slots(rng, lang)
    pool = {key: split_of(templates, split) for key, templates in TEMPLATES.items()}
    nonfacts = {key: split_of(texts, split) for key, texts in NONFACTS.items()}
    leads = LEAD_INS[lang]

    def template(kind: str) -> tuple[str, tuple[str, ...]]:
        return rng.choice(pool[(lang, kind)])

    # Must-keep user turns in order of appearance; a change comes well after what it changes.
    planned: list[tuple[str, str, tuple[str, ...]]] = []  # (kind, text, terms)
    kinds = list(KINDS)
    if rng.random() < 0.5:
        kinds.append("id")
    rng.shuffle(kinds)
    used: set[tuple[str, ...]] = set()
    for kind in kinds:
        if kind == "id":
            _new_ids(rng, values)
        text, terms = template(kind)
        while terms in used:  # two IDs of one kind ("订单号") would read as an update
            text, terms = template(kind)
        used.add(terms)
        planned.append((kind, _fill(text, values), tuple(_fill(t, values) for t in terms)))

    # Questions and chit-chat twice as often as requests.
    user_nonfacts = ["question", "request", "chitchat", "question", "chitchat"]
    script: list[_Turn] = []

    def filler(count: int) -> None:
        for _ in range(count):
            label = rng.choice(user_nonfacts)
            text = rng.choice(nonfacts[(lang, label)]).format(n=rng.randint(2, 60))
            script.append(_Turn("user", text, label))
            script.append(_Turn("assistant", rng.choice(nonfacts[(lang, "reply")]), "reply"))

    items: list[dict[str, Any]] = []
    positions: dict[str, int] = {}

    def keep(kind: str, text: str, terms: tuple[str, ...], supersedes: list[int]) -> None:
        lead = rng.choice(leads)
        lower = lang == "en" and text[1:2].islower() and not text.startswith(values["first"])
        content = lead + (text[0].lower() + text[1:] if lead and lower else text)
        positions[kind] = len(script)
        items.append(
            {"kind": kind, "turn": len(script), "terms": list(terms), "supersedes": supersedes}
        )
        script.append(_Turn("user", content, "keep"))
        script.append(_Turn("assistant", rng.choice(nonfacts[(lang, "reply")]), "reply"))

    filler(rng.randint(2, 4))
    for kind, text, terms in planned:
        keep(kind, text, terms, [])
        filler(rng.randint(1, 4))
    # Changes: the decision always, the code in about half of the conversations (twice at times).
    changes = ["decision"] + (["code"] if rng.random() < 0.5 else [])
    if rng.random() < 0.3:
        changes.append("decision")
    for kind in changes:
        filler(rng.randint(2, 5))
        earlier = [i for i in items if i["kind"] == kind]
        previous = earlier[-1]
        change_kind = "decision_change" if kind == "decision" else "code_update"
        if previous["supersedes"] and kind == "decision":  # a second change: a third option
            options = (OPTIONS_EN if lang == "en" else OPTIONS_ZH)[values["slot"]]
            third = rng.choice([o for o in options if o not in (values["opt"], values["opt2"])])
            _set_options(values, values["opt2"], third)
        elif previous["supersedes"]:
            _set_codes(values, values["code2"], code(rng))
        text, terms = template(change_kind)
        supersedes = [*previous["supersedes"], previous["turn"]]
        previous["superseded"] = True
        keep(kind, _fill(text, values), tuple(_fill(t, values) for t in terms), supersedes)
    filler(rng.randint(12, 16))  # the tail that stays in the window
    for item in items:
        item.setdefault("superseded", False)
    return {
        "id": f"{lang}-{split}-{seed}",
        "language": lang,
        "split": split,
        "seed": seed,
        "turns": [{"role": t.role, "content": t.content, "label": t.label} for t in script],
        "items": items,
    }


def generate_suite(conversations: int, languages: Sequence[Language] = ("en", "zh"),
                   splits: Sequence[Split] = ("dev", "heldout")) -> dict[str, Any]:  # fmt: skip
    """`conversations` per language and split; dev seeds 0.., held-out seeds 10000.."""
    out: list[dict[str, Any]] = []
    for split in splits:
        base = 0 if split == "dev" else HELDOUT_SEED_BASE
        for lang in languages:
            out.extend(generate_conversation(lang, split, base + i) for i in range(conversations))
    return {"version": 1, "conversations": out}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--conversations", type=int, default=12, help="per language and split")
    parser.add_argument("--split", choices=["dev", "heldout", "both"], default="both")
    args = parser.parse_args(argv)
    splits: tuple[Split, ...] = ("dev", "heldout") if args.split == "both" else (args.split,)
    suite = generate_suite(args.conversations, splits=splits)
    Path(args.out).write_text(json.dumps(suite, ensure_ascii=False, indent=1))
    print(f"{len(suite['conversations'])} conversations -> {args.out}")


if __name__ == "__main__":
    main()
